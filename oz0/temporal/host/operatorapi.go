package main

import (
	"strings"

	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/server/common/api"
)

// What an operator may call on Temporal: read, in its tenants' namespaces, and nothing else
// (an allowlist: a call not named here is refused). Work reaches nodes only through
// orchestrator-zero's API, where it is authorized and audited: starting, signalling,
// terminating, cancelling, resetting or updating a workflow, polling or answering a task,
// and every namespace or cluster admin call would let an operator act on nodes (or on the
// jobs of a tenant) with no job row and no audit entry, so none is here.
//
// Every call here reads what every role may read through the API (access.Right.READ), so a
// viewer has all of them. Workflow history (GetWorkflowExecutionHistory and its reverse) is
// for nobody: a job's workflow input carries its environment variables' values, which the
// API never shows anyone (`job show` lists their names only), and the history carries each
// attempt's input too. For the same reason QueryWorkflow (it runs the job's workflow code
// on a server's worker, which holds that input) is not here. ListNamespaces is not here
// either: it would name every tenant; `orchestrator-zero tenant list` answers that, scoped.
// docs/run-a-cluster.md lists the same calls.
var operatorAPIs = map[string]operatorAPI{
	// The `temporal` CLI's `workflow list`, `workflow count`, `workflow describe`.
	api.WorkflowServicePrefix + "ListWorkflowExecutions":    {namespaced: true},
	api.WorkflowServicePrefix + "CountWorkflowExecutions":   {namespaced: true},
	api.WorkflowServicePrefix + "DescribeWorkflowExecution": {namespaced: true},
	// `operator namespace describe NAME` (by name: by ID the namespace is not known here).
	api.WorkflowServicePrefix + "DescribeNamespace": {namespaced: true, check: namespaceByName},
	// `task-queue describe`: which workers poll a queue (a node's queue is its ID).
	api.WorkflowServicePrefix + "DescribeTaskQueue": {namespaced: true},
	// `operator search-attribute list`, and the search attributes a list query may use.
	api.OperatorServicePrefix + "ListSearchAttributes": {namespaced: true},
	api.WorkflowServicePrefix + "GetSearchAttributes":  {},
	// `operator cluster describe` (GetSystemInfo, which SDKs call first, is open to all).
	api.WorkflowServicePrefix + "GetClusterInfo": {},
}

// operatorAPI is how a call an operator may make is checked.
type operatorAPI struct {
	// The call names a namespace, which must be one of the operator's tenants'; otherwise
	// it is about the cluster and names none.
	namespaced bool
	// What else the request must be; returns why it is refused, or "". Optional.
	check func(req any) string
}

func namespaceByName(req any) string {
	r, ok := req.(*workflowservice.DescribeNamespaceRequest)
	if !ok {
		return "unexpected request"
	}
	if r.GetId() != "" {
		return "namespace must be named, not given by ID"
	}
	return ""
}

// Roles, as in orchestrator-zero's API (oz0/access.py): every one may read, so every one
// may make the calls above.
var operatorRoles = map[string]bool{"viewer": true, "operator": true, "admin": true}

// reservedNamespacePrefix: Temporal's own namespaces (temporal-system) take it, and no
// tenant may (oz0/tenants.py RESERVED_PREFIX).
const reservedNamespacePrefix = "temporal-"

// OperatorGrant is what the parent pushes for one operator: the one certificate it may
// call with, its role and its tenants.
type OperatorGrant struct {
	Serial string `json:"serial"` // decimal, as PostgreSQL stores it
	Role   string `json:"role"`   // viewer, operator or admin
	// Tenants whose namespaces (a tenant's namespace has its name) it may read; none: every
	// tenant's, a cluster-wide operator.
	Tenants []string `json:"tenants"`
}

// operatorGrant is an OperatorGrant as the authorizer keeps it.
type operatorGrant struct {
	serial  string
	role    string
	tenants map[string]bool // empty: every tenant
}

func newOperatorGrant(g *OperatorGrant) *operatorGrant {
	tenants := make(map[string]bool, len(g.Tenants))
	for _, t := range g.Tenants {
		tenants[t] = true
	}
	return &operatorGrant{serial: g.Serial, role: g.Role, tenants: tenants}
}

// same: whether O grants exactly what G does (nil grants nothing).
func (g *operatorGrant) same(o *operatorGrant) bool {
	if g == nil || o == nil {
		return g == o
	}
	if g.serial != o.serial || g.role != o.role || len(g.tenants) != len(o.tenants) {
		return false
	}
	for t := range g.tenants {
		if !o.tenants[t] {
			return false
		}
	}
	return true
}

// reaches: whether NS is the namespace of one of the operator's tenants. A cluster-wide
// operator reaches every tenant's namespace: every namespace but Temporal's own (operators
// can create none, and a server registers only tenants').
func (g *operatorGrant) reaches(ns string) bool {
	if ns == "" || strings.HasPrefix(ns, reservedNamespacePrefix) {
		return false
	}
	return len(g.tenants) == 0 || g.tenants[ns]
}

// operatorMay: why the operator holding G may not call API on namespace NS with REQ, or ""
// when it may. The authorizer asks, and the interceptor again once the call is tracked.
func operatorMay(g *operatorGrant, apiName, ns string, req any) string {
	if !operatorRoles[g.role] {
		return "unknown operator role"
	}
	call, listed := operatorAPIs[apiName]
	if !listed {
		return "operators may only read on Temporal: work goes through the API"
	}
	if call.namespaced && !g.reaches(ns) {
		return "namespace is not one of the operator's tenants"
	}
	if call.check != nil {
		return call.check(req)
	}
	return ""
}
