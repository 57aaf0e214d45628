package main

import (
	"bufio"
	"context"
	"crypto/x509"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/server/common/api"
	"go.temporal.io/server/common/authorization"
	"google.golang.org/grpc"
)

// Operators on Temporal: only the certificate whose serial the parent pushed may call, and
// only to read, in the namespaces of the operator's tenants.

// grant is what the parent pushes for an operator holding CERT.
func grant(cert *x509.Certificate, role string, tenants ...string) *OperatorGrant {
	return &OperatorGrant{Serial: cert.SerialNumber.String(), Role: role, Tenants: tenants}
}

var (
	apiSignalWithStart  = api.WorkflowServicePrefix + "SignalWithStartWorkflowExecution"
	apiRequestCancel    = api.WorkflowServicePrefix + "RequestCancelWorkflowExecution"
	apiReset            = api.WorkflowServicePrefix + "ResetWorkflowExecution"
	apiUpdateWorkflow   = api.WorkflowServicePrefix + "UpdateWorkflowExecution"
	apiMultiOperation   = api.WorkflowServicePrefix + "ExecuteMultiOperation"
	apiQueryWorkflow    = api.WorkflowServicePrefix + "QueryWorkflow"
	apiHistoryReverse   = api.WorkflowServicePrefix + "GetWorkflowExecutionHistoryReverse"
	apiRespondWFTask    = api.WorkflowServicePrefix + "RespondWorkflowTaskCompleted"
	apiCreateSchedule   = api.WorkflowServicePrefix + "CreateSchedule"
	apiStartBatch       = api.WorkflowServicePrefix + "StartBatchOperation"
	apiDeprecateNS      = api.WorkflowServicePrefix + "DeprecateNamespace"
	apiGetSearchAttrs   = api.WorkflowServicePrefix + "GetSearchAttributes"
	apiAdminDescribeHst = api.AdminServicePrefix + "DescribeHistoryHost"
)

// What an operator may not do, whatever its role, even in its own tenant's namespace.
var operatorRefusedInItsNamespace = []string{
	apiStartWorkflow, apiSignalWorkflow, apiSignalWithStart, apiTerminate, apiRequestCancel,
	apiReset, apiUpdateWorkflow, apiMultiOperation, apiQueryWorkflow,
	// the history carries the job's input, environment values included (operatorapi.go)
	apiHistory, apiHistoryReverse,
	apiPollWorkflow, apiPollActivity, apiRespondWFTask, apiHeartbeat, apiHeartbeatByID,
	apiCompleted, apiCompletedByID, apiFailed, apiFailedByID, apiCanceled, apiCanceledByID,
	apiShutdownWorker, apiWorkerHeartbeat, apiCreateSchedule, apiStartBatch,
	apiRegisterNS, apiUpdateNS, apiDeprecateNS, apiOpAddSA, apiOpDeleteNS,
	apiAdminDescribeMS, apiUnknownWF,
}

// What every role may do in its own tenant's namespace.
var operatorReadsInItsNamespace = []string{
	apiListWorkflows, apiCountWorkflows, apiDescribeWF, apiDescribeNS, apiDescribeTQ, apiOpListSA,
}

func TestTheOperatorAllowlistHoldsOnlyReadOnlyCalls(t *testing.T) {
	for name, call := range operatorAPIs {
		md := api.GetMethodMetadata(name)
		if md.Access != api.AccessReadOnly {
			t.Errorf("allowlisted %s is not read-only (%+v)", name, md)
		}
		if want := map[bool]api.Scope{true: api.ScopeNamespace, false: api.ScopeCluster}[call.namespaced]; md.Scope != want {
			t.Errorf("allowlisted %s: scope %v, but namespaced = %v", name, md.Scope, call.namespaced)
		}
	}
	for _, name := range operatorReadsInItsNamespace {
		if _, listed := operatorAPIs[name]; !listed {
			t.Errorf("%s is not allowlisted", name)
		}
	}
}

func TestEveryRoleMayOnlyReadOnTemporal(t *testing.T) {
	pki := newTestPKI(t)
	table := newAuthz(nil)
	z := authorizer{a: table}
	certs := map[string]*x509.Certificate{}
	grants := map[string]*OperatorGrant{}
	for _, role := range []string{"viewer", "operator", "admin"} {
		certs[role] = pki.role(t, "operator", role)
		grants[role] = grant(certs[role], role, "acme")
	}
	// A cluster-wide admin too: a wider scope is no more power.
	certs["root"] = pki.role(t, "operator", "root")
	grants["root"] = grant(certs["root"], "admin")
	table.setOperators(grants)
	for who, cert := range certs {
		c := pki.claims(t, cert)
		for _, name := range operatorReadsInItsNamespace {
			if r := authorize(t, z, c, name, "acme"); r.Decision != authorization.DecisionAllow {
				t.Errorf("%s calling %s in acme: %s (%q), want allow", who, name, decisionName(r.Decision), r.Reason)
			}
		}
		for _, name := range []string{apiClusterInfo, apiGetSearchAttrs, apiSystemInfo, apiHealthCheck} {
			if r := authorize(t, z, c, name, ""); r.Decision != authorization.DecisionAllow {
				t.Errorf("%s calling %s: %s (%q), want allow", who, name, decisionName(r.Decision), r.Reason)
			}
		}
		for _, name := range operatorRefusedInItsNamespace {
			if r := authorize(t, z, c, name, "acme"); r.Decision != authorization.DecisionDeny || r.Reason == "" {
				t.Errorf("%s calling %s in acme: %s (%q), want deny with a reason", who, name, decisionName(r.Decision), r.Reason)
			}
		}
		for _, name := range []string{apiListNS, apiAdminDescribeHst} {
			if r := authorize(t, z, c, name, ""); r.Decision != authorization.DecisionDeny {
				t.Errorf("%s calling %s: %s, want deny", who, name, decisionName(r.Decision))
			}
		}
	}
	if r := authorize(t, z, pki.claims(t, certs["viewer"]), apiStartWorkflow, "acme"); r.Reason != "operators may only read on Temporal: work goes through the API" {
		t.Fatalf("refusal reason = %q", r.Reason)
	}
}

func TestAnOperatorReadsOnlyItsTenantsNamespaces(t *testing.T) {
	pki := newTestPKI(t)
	table := newAuthz(nil)
	z := authorizer{a: table}
	acme, two, wide := pki.role(t, "operator", "alice"), pki.role(t, "operator", "bob"), pki.role(t, "operator", "carol")
	table.setOperators(map[string]*OperatorGrant{
		"alice": grant(acme, "viewer", "acme"),
		"bob":   grant(two, "operator", "acme", "beta"),
		"carol": grant(wide, "admin"),
	})
	cases := []struct {
		who  *x509.Certificate
		ns   string
		want authorization.Decision
	}{
		{acme, "acme", authorization.DecisionAllow},
		{acme, "default", authorization.DecisionDeny},
		{acme, "beta", authorization.DecisionDeny},
		{acme, "ACME", authorization.DecisionDeny},
		{acme, "", authorization.DecisionDeny},
		{acme, "temporal-system", authorization.DecisionDeny},
		{two, "acme", authorization.DecisionAllow},
		{two, "beta", authorization.DecisionAllow},
		{two, "default", authorization.DecisionDeny},
		// cluster-wide: every tenant's namespace, never Temporal's own
		{wide, "acme", authorization.DecisionAllow},
		{wide, "default", authorization.DecisionAllow},
		{wide, "any-tenant", authorization.DecisionAllow},
		{wide, "temporal-system", authorization.DecisionDeny},
		{wide, "temporal-visibility", authorization.DecisionDeny},
		{wide, "", authorization.DecisionDeny},
	}
	for _, tc := range cases {
		for _, name := range []string{apiListWorkflows, apiDescribeNS} {
			r := authorize(t, z, pki.claims(t, tc.who), name, tc.ns)
			if r.Decision != tc.want {
				t.Errorf("%s calling %s in %q: %s (%q), want %s", tc.who.Subject.CommonName, name, tc.ns, decisionName(r.Decision), r.Reason, decisionName(tc.want))
			}
		}
	}
	// A namespace given by ID is not known to be the operator's.
	byID := &workflowservice.DescribeNamespaceRequest{Id: "5b5bd0a8-0ea0-4b8a-9d8e-0a5d0f1e2c3d"}
	if r := authorizeRequest(t, z, pki.claims(t, wide), apiDescribeNS, "", byID); r.Decision != authorization.DecisionDeny {
		t.Fatalf("DescribeNamespace by ID: %s, want deny", decisionName(r.Decision))
	}
	byBoth := &workflowservice.DescribeNamespaceRequest{Namespace: "acme", Id: "5b5bd0a8-0ea0-4b8a-9d8e-0a5d0f1e2c3d"}
	if r := authorizeRequest(t, z, pki.claims(t, acme), apiDescribeNS, "acme", byBoth); r.Decision != authorization.DecisionDeny {
		t.Fatalf("DescribeNamespace by name and ID: %s, want deny", decisionName(r.Decision))
	}
}

func TestAnOperatorWithAnUnknownRoleMayDoNothing(t *testing.T) {
	pki := newTestPKI(t)
	cert := pki.role(t, "operator", "alice")
	table := newAuthz(nil)
	table.setOperators(map[string]*OperatorGrant{"alice": grant(cert, "root")})
	if r := authorize(t, authorizer{a: table}, pki.claims(t, cert), apiListWorkflows, "default"); r.Decision != authorization.DecisionDeny {
		t.Fatalf("role root: %s, want deny", decisionName(r.Decision))
	}
}

func TestOnlyTheOperatorsCurrentCertificateMayCall(t *testing.T) {
	pki := newTestPKI(t)
	table := newAuthz(nil)
	z := authorizer{a: table}
	first, renewed := pki.role(t, "operator", "alice"), pki.role(t, "operator", "alice")
	c1, c2 := pki.claims(t, first), pki.claims(t, renewed)
	expect := func(step string, c *authorization.Claims, want authorization.Decision) {
		t.Helper()
		if r := authorize(t, z, c, apiListWorkflows, "default"); r.Decision != want {
			t.Fatalf("%s: %s (%q), want %s", step, decisionName(r.Decision), r.Reason, decisionName(want))
		}
	}
	expect("no operators pushed yet", c1, authorization.DecisionDeny)
	table.setOperators(map[string]*OperatorGrant{"alice": grant(first, "admin")})
	expect("first certificate current", c1, authorization.DecisionAllow)
	expect("renewed certificate not yet current", c2, authorization.DecisionDeny)
	table.setOperators(map[string]*OperatorGrant{"alice": grant(renewed, "admin")})
	expect("after renewal, the old one", c1, authorization.DecisionDeny)
	expect("after renewal, the new one", c2, authorization.DecisionAllow)
	// Another operator's serial never lets alice in.
	table.setOperators(map[string]*OperatorGrant{"bob": grant(renewed, "admin")})
	expect("serial pushed for another name", c2, authorization.DecisionDeny)
	table.setOperators(map[string]*OperatorGrant{"alice": grant(renewed, "viewer", "acme")})
	expect("moved to another tenant", c2, authorization.DecisionDeny)
	table.setOperators(map[string]*OperatorGrant{"alice": nil})
	expect("a null grant", c2, authorization.DecisionDeny)
	table.setOperators(map[string]*OperatorGrant{})
	expect("operator removed", c2, authorization.DecisionDeny)
	if table.operatorCount() != 0 {
		t.Fatalf("operatorCount = %d, want 0", table.operatorCount())
	}
}

func TestSetOperatorsCopiesTheTable(t *testing.T) {
	pki := newTestPKI(t)
	cert := pki.role(t, "operator", "alice")
	pushed := map[string]*OperatorGrant{"alice": grant(cert, "viewer", "default")}
	table := newAuthz(nil)
	table.setOperators(pushed)
	pushed["alice"].Serial = "1"
	pushed["alice"].Tenants[0] = "acme"
	if r := authorize(t, authorizer{a: table}, pki.claims(t, cert), apiListWorkflows, "default"); r.Decision != authorization.DecisionAllow {
		t.Fatalf("the caller's map is aliased by the table: %q", r.Reason)
	}
}

var listInfo = &grpc.UnaryServerInfo{FullMethod: apiListWorkflows}

func TestRenewalCancelsCallsOfTheOldCertificateOnly(t *testing.T) {
	pki := newTestPKI(t)
	oldCert, newCert, bobCert := pki.role(t, "operator", "alice"), pki.role(t, "operator", "alice"), pki.role(t, "operator", "bob")
	table := newAuthz(nil)
	table.setOperators(map[string]*OperatorGrant{"alice": grant(oldCert, "admin"), "bob": grant(bobCert, "admin")})
	list := nsRequest{"default"}
	old := startCallOf(t, table, pki.peerCtx(t, context.Background(), oldCert), listInfo, list)
	bob := startCallOf(t, table, pki.peerCtx(t, context.Background(), bobCert), listInfo, list)
	if got := trackedCalls(table); got != 2 {
		t.Fatalf("tracked calls = %d, want 2", got)
	}
	if n := table.setOperators(map[string]*OperatorGrant{"alice": grant(newCert, "admin"), "bob": grant(bobCert, "admin")}); n != 1 {
		t.Fatalf("renewal cancelled %d calls, want 1", n)
	}
	old.expectCancelled(t)
	bob.expectLive(t)
	renewed := startCallOf(t, table, pki.peerCtx(t, context.Background(), newCert), listInfo, list)
	if n := table.setOperators(map[string]*OperatorGrant{"alice": grant(newCert, "admin")}); n != 0 {
		t.Fatalf("pushing the same grant again cancelled %d calls", n)
	}
	renewed.expectLive(t)
}

// A change of role or tenants, or a removal, cuts the operator's calls in flight.
func TestAnyChangeOfAGrantCancelsTheOperatorsCalls(t *testing.T) {
	pki := newTestPKI(t)
	cert := pki.role(t, "operator", "alice")
	list := nsRequest{"acme"}
	for step, next := range map[string]*OperatorGrant{
		"another role":   grant(cert, "viewer", "acme"),
		"another tenant": grant(cert, "operator", "acme", "beta"),
		"cluster-wide":   grant(cert, "operator"),
		"removed":        nil,
		"another serial": {Serial: "1", Role: "operator", Tenants: []string{"acme"}},
	} {
		t.Run(step, func(t *testing.T) {
			table := newAuthz(nil)
			table.setOperators(map[string]*OperatorGrant{"alice": grant(cert, "operator", "acme")})
			call := startCallOf(t, table, pki.peerCtx(t, context.Background(), cert), listInfo, list)
			if n := table.setOperators(map[string]*OperatorGrant{"alice": next}); n != 1 {
				t.Fatalf("cancelled %d calls, want 1", n)
			}
			call.expectCancelled(t)
		})
	}
}

// A renewal or a change of tenants after Temporal's authorizer allowed a call, before it is
// tracked: the interceptor asks again.
func TestInterceptorRefusesAnOperatorCallAfterAChange(t *testing.T) {
	pki := newTestPKI(t)
	oldCert, newCert := pki.role(t, "operator", "alice"), pki.role(t, "operator", "alice")
	table := newAuthz(nil)
	table.setOperators(map[string]*OperatorGrant{"alice": grant(newCert, "viewer", "acme")})
	ran := false
	_, err := table.interceptor(pki.peerCtx(t, context.Background(), oldCert), nsRequest{"acme"}, listInfo, func(context.Context, any) (any, error) {
		ran = true
		return nil, nil
	})
	if err == nil || ran {
		t.Fatalf("old certificate's call ran (err %v)", err)
	}
	current := pki.peerCtx(t, context.Background(), newCert)
	resp, err := table.interceptor(current, nsRequest{"acme"}, listInfo, func(context.Context, any) (any, error) {
		return "ran", nil
	})
	if err != nil || resp != "ran" {
		t.Fatalf("current certificate: (%v, %v), want (ran, nil)", resp, err)
	}
	table.setOperators(map[string]*OperatorGrant{"alice": grant(newCert, "viewer", "beta")})
	if _, err := table.interceptor(current, nsRequest{"acme"}, listInfo, func(context.Context, any) (any, error) {
		t.Error("handler ran in a tenant the operator lost")
		return nil, nil
	}); !isPermissionDenied(err) {
		t.Fatalf("after the tenant change: %v, want PermissionDenied", err)
	}
	if _, err := table.interceptor(current, nsRequest{"beta"}, pollInfo, func(context.Context, any) (any, error) {
		t.Error("an operator's poll ran")
		return nil, nil
	}); !isPermissionDenied(err) {
		t.Fatalf("a poll: %v, want PermissionDenied", err)
	}
}

func TestHandleOperatorsCommand(t *testing.T) {
	f := captureProtocol(t)
	pki := newTestPKI(t)
	table := newAuthz(nil)
	stopCh := make(chan string, 1)
	cert := pki.role(t, "operator", "alice")
	serial := cert.SerialNumber.String()
	current := func() *operatorGrant { return table.grantOf(operatorCert{name: "alice", serial: serial}) }
	handleCommand([]byte(`{"id":7,"op":"operators","operators":{"alice":{"serial":"`+serial+`","role":"viewer","tenants":["acme"]}}}`), table, nil, stopCh)
	if g := current(); g == nil || g.role != "viewer" || !g.tenants["acme"] || len(g.tenants) != 1 {
		t.Fatalf("operators command did not take effect: %+v", g)
	}
	// A command without its table is refused, not taken as "no operators".
	handleCommand([]byte(`{"id":8,"op":"operators"}`), table, nil, stopCh)
	if current() == nil {
		t.Fatal("an operators command without a table emptied it")
	}
	handleCommand([]byte(`{"id":9,"op":"operators","operators":{}}`), table, nil, stopCh)
	if table.operatorCount() != 0 {
		t.Fatal("an empty operators table was not applied")
	}
	acks := readProtocol(t, f)
	if len(acks) != 3 || acks[0]["ack"] != 7.0 || acks[0]["operators"] != 1.0 || acks[0]["error"] != nil {
		t.Fatalf("acks = %v", acks)
	}
	if acks[1]["ack"] != 8.0 || acks[1]["error"] == nil {
		t.Fatalf("ack for the command without a table = %v, want an error", acks[1])
	}
	if acks[2]["ack"] != 9.0 || acks[2]["operators"] != 0.0 {
		t.Fatalf("ack for the empty table = %v", acks[2])
	}
}

func TestConfigOperatorsAreTheInitialTable(t *testing.T) {
	c, err := parseConfig([]byte(`{"advertise":"127.0.0.1","operators":{"alice":{"serial":"42","role":"admin","tenants":[]}}}`))
	if err != nil {
		t.Fatal(err)
	}
	if g := c.Operators["alice"]; g == nil || g.Serial != "42" || g.Role != "admin" || len(g.Tenants) != 0 {
		t.Fatalf("operators = %v", c.Operators)
	}
	// Unknown keys in a grant are rejected as everywhere in the config.
	if _, err := parseConfig([]byte(`{"advertise":"127.0.0.1","operators":{"alice":{"serial":"42","rol":"admin"}}}`)); err == nil {
		t.Fatal("a grant with an unknown key was accepted")
	}
}

// captureProtocol points the protocol channel at a file for this test.
func captureProtocol(t *testing.T) *os.File {
	t.Helper()
	f, err := os.Create(filepath.Join(t.TempDir(), "protocol"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	outMu.Lock()
	saved := out
	out = f
	outMu.Unlock()
	t.Cleanup(func() {
		outMu.Lock()
		out = saved
		outMu.Unlock()
	})
	return f
}

func readProtocol(t *testing.T, f *os.File) []map[string]any {
	t.Helper()
	if _, err := f.Seek(0, 0); err != nil {
		t.Fatal(err)
	}
	var lines []map[string]any
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("bad protocol line %q: %v", sc.Text(), err)
		}
		lines = append(lines, m)
	}
	return lines
}
