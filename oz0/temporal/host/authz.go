package main

import (
	"context"
	"crypto/x509"
	"strings"
	"sync"

	"go.temporal.io/server/common/api"
	"go.temporal.io/server/common/authorization"
	"go.temporal.io/server/common/config"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Identities are carried by the client certificate (cluster CA): OU is the role, CN the name.
//   node:<node-id>      a node runtime: its tenant's namespace only, while accepted
//   server:<server-id>  an orchestrator-zero server: everything
//   operator:<name>     an operator: everything
// Anything else is denied (health checks and GetSystemInfo excepted, as in Temporal).

const (
	prefixNode     = "node:"
	prefixServer   = "server:"
	prefixOperator = "operator:"
	stateAccepted  = "accepted"
)

// NodeEntry is one row of the table pushed by the parent.
type NodeEntry struct {
	Tenant    string `json:"tenant"`
	Namespace string `json:"namespace,omitempty"` // default: Tenant
	State     string `json:"state"`               // only "accepted" is allowed to call
}

func (e *NodeEntry) namespace() string {
	if e.Namespace != "" {
		return e.Namespace
	}
	return e.Tenant
}

func (e *NodeEntry) allows(ns string) bool {
	return e != nil && e.State == stateAccepted && ns != "" && ns == e.namespace()
}

// nodeID is stored in Claims.Extensions for node callers.
type nodeID string

type authz struct {
	mu    sync.RWMutex
	nodes map[string]*NodeEntry
	// in-flight calls per node, cancelled when the node loses access
	calls  map[string]map[uint64]context.CancelFunc
	nextID uint64
}

func newAuthz(initial map[string]*NodeEntry) *authz {
	a := &authz{nodes: map[string]*NodeEntry{}, calls: map[string]map[uint64]context.CancelFunc{}}
	a.update(initial, true)
	return a
}

// update applies a table change. replace=true swaps the whole table; otherwise entries are
// merged and a null entry deletes a node. Calls in flight from nodes that lost access
// (or whose namespace changed) are cancelled. Returns how many calls were cancelled.
func (a *authz) update(nodes map[string]*NodeEntry, replace bool) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	old := a.nodes
	next := make(map[string]*NodeEntry, len(old)+len(nodes))
	if !replace {
		for k, v := range old {
			next[k] = v
		}
	}
	for k, v := range nodes {
		if v == nil {
			delete(next, k)
		} else {
			e := *v
			next[k] = &e
		}
	}
	a.nodes = next
	cancelled := 0
	for id, calls := range a.calls {
		o, n := old[id], next[id]
		keeps := n != nil && n.State == stateAccepted && o != nil && o.namespace() == n.namespace()
		if keeps {
			continue
		}
		for _, cancel := range calls {
			cancel()
			cancelled++
		}
		delete(a.calls, id)
	}
	return cancelled
}

func (a *authz) lookup(id string) *NodeEntry {
	a.mu.RLock()
	defer a.mu.RUnlock()
	return a.nodes[id]
}

func (a *authz) size() int {
	a.mu.RLock()
	defer a.mu.RUnlock()
	return len(a.nodes)
}

// identity is "<role>:<name>" from a certificate the cluster CA issued: the role is the
// subject's OU (node, server or operator) and the name its CN. orchestrator-zero's PKI
// sets both and nothing else is trusted, so a node cannot claim a role through a SAN.
func identity(cert *x509.Certificate) string {
	if cert == nil || len(cert.Subject.OrganizationalUnit) != 1 || cert.Subject.CommonName == "" {
		return ""
	}
	role := cert.Subject.OrganizationalUnit[0]
	switch role + ":" {
	case prefixNode, prefixServer, prefixOperator:
		return role + ":" + cert.Subject.CommonName
	}
	return ""
}

// --- ClaimMapper ---

type claimMapper struct{}

var _ authorization.ClaimMapper = claimMapper{}

func (claimMapper) GetClaims(info *authorization.AuthInfo) (*authorization.Claims, error) {
	var cert *x509.Certificate
	if info != nil {
		cert = authorization.PeerCert(info.TLSConnection)
	}
	id := identity(cert)
	c := &authorization.Claims{Subject: id, AuthType: "mtls"}
	switch {
	case strings.HasPrefix(id, prefixServer), strings.HasPrefix(id, prefixOperator):
		c.System = authorization.RoleAdmin
	case strings.HasPrefix(id, prefixNode) && len(id) > len(prefixNode):
		c.Extensions = nodeID(strings.TrimPrefix(id, prefixNode))
	}
	return c, nil
}

// --- Authorizer ---

type authorizer struct{ a *authz }

var _ authorization.Authorizer = authorizer{}

var (
	allow = authorization.Result{Decision: authorization.DecisionAllow}
)

func deny(reason string) authorization.Result {
	return authorization.Result{Decision: authorization.DecisionDeny, Reason: reason}
}

func (z authorizer) Authorize(_ context.Context, claims *authorization.Claims, target *authorization.CallTarget) (authorization.Result, error) {
	if authorization.IsHealthCheckAPI(target.APIName) {
		return allow, nil
	}
	if claims == nil {
		return deny("no identity"), nil
	}
	// servers, operators, and Temporal's own internal-frontend (internal claim mapper)
	if claims.System&authorization.RoleAdmin != 0 {
		r := allow
		return r, nil
	}
	id, ok := claims.Extensions.(nodeID)
	if !ok {
		return deny("unknown identity"), nil
	}
	e := z.a.lookup(string(id))
	if e == nil {
		return deny("unknown node"), nil
	}
	if e.State != stateAccepted {
		return deny("node not accepted"), nil
	}
	if !strings.HasPrefix(target.APIName, api.WorkflowServicePrefix) {
		return deny("API not allowed for nodes"), nil
	}
	md := api.GetMethodMetadata(target.APIName)
	if md.Scope != api.ScopeNamespace || md.Access == api.AccessAdmin || md.Access == api.AccessUnknown {
		return deny("API not allowed for nodes"), nil
	}
	if !e.allows(target.Namespace) {
		return deny("namespace not allowed"), nil
	}
	return allow, nil
}

// --- in-flight call tracking (so a block cuts long polls at once) ---

func (a *authz) interceptor(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	id := identity(authorization.PeerCert(authorization.TLSInfoFromContext(ctx)))
	if !strings.HasPrefix(id, prefixNode) {
		return handler(ctx, req)
	}
	node := strings.TrimPrefix(id, prefixNode)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	a.mu.Lock()
	// Temporal's authorizer ran before this interceptor, outside this lock: a block that
	// landed in between cancelled nothing, so look again now that the call is tracked.
	if r, scoped := req.(interface{ GetNamespace() string }); scoped && !a.nodes[node].allows(r.GetNamespace()) {
		a.mu.Unlock()
		return nil, status.Error(codes.PermissionDenied, "node lost access")
	}
	a.nextID++
	key := a.nextID
	if a.calls[node] == nil {
		a.calls[node] = map[uint64]context.CancelFunc{}
	}
	a.calls[node][key] = cancel
	a.mu.Unlock()
	defer func() {
		a.mu.Lock()
		if m := a.calls[node]; m != nil {
			delete(m, key)
			if len(m) == 0 {
				delete(a.calls, node)
			}
		}
		a.mu.Unlock()
	}()
	return handler(ctx, req)
}

func claimMapperFactory(*config.Config) authorization.ClaimMapper { return claimMapper{} }
