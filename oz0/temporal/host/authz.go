package main

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"strings"
	"sync"

	"go.temporal.io/api/serviceerror"
	"go.temporal.io/server/common/authorization"
	"go.temporal.io/server/common/config"
	"go.temporal.io/server/common/log"
	"google.golang.org/grpc"
)

// Identities are carried by the client certificate (cluster CA): OU is the role, CN the name.
//   node:<node-id>      a node runtime: an activity worker on its own task queue, in its
//                       tenant's namespace, while accepted (nodeapi.go lists what it may call),
//                       with the certificate for the key the parent pushed as the node's
//                       current one; a renewed-away certificate is refused
//   server:<server-id>  an orchestrator-zero server: everything
//   operator:<name>     an operator: only reads, in its tenants' namespaces (operatorapi.go
//                       lists them), with the certificate whose serial the parent pushed as
//                       that operator's current one; any other is refused
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
	// KeySHA256 names the one certificate the node may call with: the hex SHA-256 of the
	// DER SubjectPublicKeyInfo of its current certificate's key (nodes.public_key_sha256).
	// The key rather than the serial: it is what the edge checks too, and a certificate
	// issued again for the same key (accept after a pending join) stays the node's.
	// Empty (no certificate issued): no certificate may call.
	KeySHA256 string `json:"keySha256,omitempty"`
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

// heldBy: whether a certificate for the key KEY (keyOf) is the node's current one.
func (e *NodeEntry) heldBy(key string) bool {
	return e != nil && e.KeySHA256 != "" && key == e.KeySHA256
}

// keyOf is how the parent names a certificate's key: hex SHA-256 of its DER
// SubjectPublicKeyInfo, as the nodes table stores it.
func keyOf(cert *x509.Certificate) string {
	sum := sha256.Sum256(cert.RawSubjectPublicKeyInfo)
	return hex.EncodeToString(sum[:])
}

// nodeCert is stored in Claims.Extensions for node callers: whether its key is the node's
// current one is decided per call, so a renewal takes effect at once.
type nodeCert struct {
	id  string
	key string // keyOf the certificate
}

// operatorCert is stored in Claims.Extensions for operator callers: what it may do is
// decided per call, against the operator's current serial, role and tenants, so a renewal,
// a removal or a change of role or tenants takes effect at once.
type operatorCert struct {
	name   string
	serial string // decimal, as PostgreSQL stores it
}

// caller is who an in-flight call is tracked for: one certificate of a node or an operator.
type caller struct {
	role, name string
	cert       string // an operator's certificate serial, a node certificate's keyOf
}

type authz struct {
	mu    sync.RWMutex
	nodes map[string]*NodeEntry
	// operator name -> its current certificate, role and tenants
	operators map[string]*operatorGrant
	// task tokens handed to each node by its polls (only these it may heartbeat or answer)
	tokens map[string]*taskTokens
	// in-flight calls, cancelled when their caller loses access
	calls  map[caller]map[uint64]context.CancelFunc
	nextID uint64
}

func newAuthz(initial map[string]*NodeEntry) *authz {
	a := &authz{
		nodes:     map[string]*NodeEntry{},
		operators: map[string]*operatorGrant{},
		tokens:    map[string]*taskTokens{},
		calls:     map[caller]map[uint64]context.CancelFunc{},
	}
	a.update(initial, true)
	return a
}

// update applies a node table change. replace=true swaps the whole table; otherwise entries
// are merged and a null entry deletes a node. Calls in flight from nodes that lost access
// (or whose namespace changed) are cancelled and the task tokens they held forgotten.
// Returns how many calls were cancelled.
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
			e.KeySHA256 = strings.ToLower(e.KeySHA256)
			next[k] = &e
		}
	}
	a.nodes = next
	// A node keeps its calls and tasks while it stays accepted in the same namespace with
	// the same key: a renewal (new key) cuts what the old certificate has in flight.
	keeps := func(id string) bool {
		o, n := old[id], next[id]
		return n != nil && n.State == stateAccepted && o != nil && o.namespace() == n.namespace() &&
			o.KeySHA256 == n.KeySHA256
	}
	for id := range a.tokens {
		if !keeps(id) {
			delete(a.tokens, id)
		}
	}
	return a.cancelLocked(func(c caller) bool {
		return c.role == "node" && !(keeps(c.name) && next[c.name].heldBy(c.cert))
	})
}

// setOperators replaces the operators' grants (a nil one: no grant). Calls in flight of an
// operator whose grant changed in any way (removed, renewed, another role or other tenants)
// are cancelled, as are those of a certificate that is not current; returns how many.
func (a *authz) setOperators(grants map[string]*OperatorGrant) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	old := a.operators
	next := make(map[string]*operatorGrant, len(grants))
	for name, g := range grants {
		if g != nil {
			next[name] = newOperatorGrant(g)
		}
	}
	a.operators = next
	return a.cancelLocked(func(c caller) bool {
		g := next[c.name]
		return c.role == "operator" && (g == nil || g.serial != c.cert || !g.same(old[c.name]))
	})
}

// cancelLocked cancels the calls of every caller DROP selects. a.mu must be held.
func (a *authz) cancelLocked(drop func(caller) bool) int {
	cancelled := 0
	for c, calls := range a.calls {
		if !drop(c) {
			continue
		}
		for _, cancel := range calls {
			cancel()
			cancelled++
		}
		delete(a.calls, c)
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

func (a *authz) operatorCount() int {
	a.mu.RLock()
	defer a.mu.RUnlock()
	return len(a.operators)
}

// grantOf is the operator's grant if OP is its current certificate; nil otherwise.
func (a *authz) grantOf(op operatorCert) *operatorGrant {
	a.mu.RLock()
	defer a.mu.RUnlock()
	return a.currentGrantLocked(op.name, op.serial)
}

// currentGrantLocked: NAME's grant if SERIAL is its current certificate. a.mu must be held.
func (a *authz) currentGrantLocked(name, serial string) *operatorGrant {
	g := a.operators[name]
	if g == nil || serial == "" || g.serial != serial {
		return nil
	}
	return g
}

func (a *authz) nodeHoldsToken(id string, token []byte) bool {
	a.mu.RLock()
	defer a.mu.RUnlock()
	return a.tokens[id].has(token)
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

// callerOf is who CERT is, for tracking its calls; ok=false for servers and unknown callers.
func callerOf(cert *x509.Certificate) (caller, bool) {
	id := identity(cert)
	switch {
	case strings.HasPrefix(id, prefixNode):
		return caller{role: "node", name: strings.TrimPrefix(id, prefixNode), cert: keyOf(cert)}, true
	case strings.HasPrefix(id, prefixOperator):
		return caller{role: "operator", name: strings.TrimPrefix(id, prefixOperator), cert: cert.SerialNumber.String()}, true
	}
	return caller{}, false
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
	case strings.HasPrefix(id, prefixServer):
		c.System = authorization.RoleAdmin
	case strings.HasPrefix(id, prefixOperator):
		c.Extensions = operatorCert{name: strings.TrimPrefix(id, prefixOperator), serial: cert.SerialNumber.String()}
	case strings.HasPrefix(id, prefixNode) && len(id) > len(prefixNode):
		c.Extensions = nodeCert{id: strings.TrimPrefix(id, prefixNode), key: keyOf(cert)}
	}
	return c, nil
}

// --- Authorizer ---

type authorizer struct {
	a      *authz
	denied *deniedLog
}

var _ authorization.Authorizer = authorizer{}

var allow = authorization.Result{Decision: authorization.DecisionAllow}

func deny(reason string) authorization.Result {
	return authorization.Result{Decision: authorization.DecisionDeny, Reason: reason}
}

func (z authorizer) Authorize(_ context.Context, claims *authorization.Claims, target *authorization.CallTarget) (authorization.Result, error) {
	r := z.decide(claims, target)
	if r.Decision != authorization.DecisionAllow && claims != nil {
		z.denied.record(claims.Subject, target, r.Reason)
	}
	return r, nil
}

func (z authorizer) decide(claims *authorization.Claims, target *authorization.CallTarget) authorization.Result {
	if authorization.IsHealthCheckAPI(target.APIName) {
		return allow
	}
	if claims == nil {
		return deny("no identity")
	}
	// servers, and Temporal's own internal-frontend (internal claim mapper)
	if claims.System&authorization.RoleAdmin != 0 {
		return allow
	}
	switch who := claims.Extensions.(type) {
	case operatorCert:
		g := z.a.grantOf(who)
		if g == nil {
			return deny("operator certificate is not the operator's current one")
		}
		if reason := operatorMay(g, target.APIName, target.Namespace, target.Request); reason != "" {
			return deny(reason)
		}
		return allow
	case nodeCert:
		return z.decideNode(who, target)
	}
	return deny("unknown identity")
}

func (z authorizer) decideNode(who nodeCert, target *authorization.CallTarget) authorization.Result {
	id := who.id
	e := z.a.lookup(id)
	if e == nil {
		return deny("unknown node")
	}
	if e.State != stateAccepted {
		return deny("node not accepted")
	}
	if !e.heldBy(who.key) {
		return deny("node certificate is not the node's current one")
	}
	check, listed := nodeAPIs[target.APIName]
	if !listed {
		return deny("API not allowed for nodes")
	}
	if !e.allows(target.Namespace) {
		return deny("namespace not allowed")
	}
	if reason := check(z.a, id, target.Request); reason != "" {
		return deny(reason)
	}
	return allow
}

// --- in-flight call tracking (so a block or a renewal cuts long polls at once) ---

func (a *authz) interceptor(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	who, tracked := callerOf(authorization.PeerCert(authorization.TLSInfoFromContext(ctx)))
	// Health checks and GetSystemInfo are open to every caller, as Temporal has them.
	if !tracked || authorization.IsHealthCheckAPI(info.FullMethod) {
		return handler(ctx, req)
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	a.mu.Lock()
	// Temporal's authorizer ran before this interceptor, outside this lock: a block or a
	// renewal that landed in between cancelled nothing, so look again now that the call is
	// tracked.
	if !a.stillAllowedLocked(who, info.FullMethod, req) {
		a.mu.Unlock()
		return nil, serviceerror.NewPermissionDenied(authorization.RequestUnauthorized, "access was withdrawn")
	}
	a.nextID++
	key := a.nextID
	if a.calls[who] == nil {
		a.calls[who] = map[uint64]context.CancelFunc{}
	}
	a.calls[who][key] = func() { cancel(errAccessWithdrawn) }
	a.mu.Unlock()
	defer func() {
		a.mu.Lock()
		if m := a.calls[who]; m != nil {
			delete(m, key)
			if len(m) == 0 {
				delete(a.calls, who)
			}
		}
		a.mu.Unlock()
	}()
	resp, err := handler(ctx, req)
	if who.role == "node" {
		a.noteTaskTokens(who, req, resp, err)
	}
	// Cut short because its caller lost access: Temporal reports whatever the cut
	// interrupted ("context canceled", a cancelled SQL statement, as UNAVAILABLE, which a
	// client retries); the caller is told what happened instead. A call that still
	// finished keeps its answer.
	if err != nil && errors.Is(context.Cause(ctx), errAccessWithdrawn) {
		return nil, serviceerror.NewPermissionDenied(authorization.RequestUnauthorized, "access was withdrawn during the call")
	}
	return resp, err
}

// errAccessWithdrawn is the cause a call is cancelled with when its caller loses access.
var errAccessWithdrawn = errors.New("access was withdrawn")

// stillAllowedLocked re-checks what can change between Temporal's authorizer and now.
// a.mu must be held.
func (a *authz) stillAllowedLocked(who caller, apiName string, req any) bool {
	switch who.role {
	case "operator":
		g := a.currentGrantLocked(who.name, who.cert)
		if g == nil {
			return false
		}
		// Its tenants (or role) may have changed: the whole question again.
		ns := ""
		if r, scoped := req.(interface{ GetNamespace() string }); scoped {
			ns = r.GetNamespace()
		}
		return operatorMay(g, apiName, ns, req) == ""
	case "node":
		e := a.nodes[who.name]
		if !e.heldBy(who.cert) {
			return false
		}
		if r, scoped := req.(interface{ GetNamespace() string }); scoped {
			return e.allows(r.GetNamespace())
		}
	}
	return true
}

func claimMapperFactory(*config.Config) authorization.ClaimMapper { return claimMapper{} }

func newAuthorizer(a *authz, logger log.Logger) authorizer {
	return authorizer{a: a, denied: newDeniedLog(logger)}
}
