package main

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"go.temporal.io/api/serviceerror"
	taskqueuepb "go.temporal.io/api/taskqueue/v1"
	workerpb "go.temporal.io/api/worker/v1"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/server/common/api"
	"go.temporal.io/server/common/authorization"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"
)

// ---------------------------------------------------------------------------
// test PKI: a real ECDSA P-256 CA issuing client certificates

type testPKI struct {
	ca   *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
}

func randSerial(t *testing.T) *big.Int {
	t.Helper()
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func newTestPKI(t *testing.T) *testPKI {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          randSerial(t),
		Subject:               pkix.Name{CommonName: "oz0 test cluster CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	return &testPKI{ca: ca, key: key, pool: pool}
}

type certOpts struct {
	ou   []string
	o    []string
	cn   string
	dns  []string
	uris []string
	key  *ecdsa.PrivateKey // default: the node's own key for OU node, else a fresh one
}

// nodeKeys is the key each node name holds in these tests (the nodes table knows a node by
// its key): every certificate issued for node N is for nodeKey(N) unless a test says
// otherwise, and keyed() puts that key into table entries.
var nodeKeys = struct {
	sync.Mutex
	m map[string]*ecdsa.PrivateKey
}{m: map[string]*ecdsa.PrivateKey{}}

func newKey(t *testing.T) *ecdsa.PrivateKey {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

func nodeKey(name string) *ecdsa.PrivateKey {
	nodeKeys.Lock()
	defer nodeKeys.Unlock()
	if nodeKeys.m[name] == nil {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			panic(err)
		}
		nodeKeys.m[name] = key
	}
	return nodeKeys.m[name]
}

// keySHA256 is how the parent names KEY: hex SHA-256 of its DER SubjectPublicKeyInfo, as
// Python's nodes.public_key_sha256 computes it.
func keySHA256(key *ecdsa.PrivateKey) string {
	der, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		panic(err)
	}
	sum := sha256.Sum256(der)
	return hex.EncodeToString(sum[:])
}

// nodeKeyOf is the table's key for node NAME's own key (the one it joined with).
func nodeKeyOf(name string) string { return keySHA256(nodeKey(name)) }

// keyed fills in each entry without a key the node's own key, as the parent pushes it (in
// place, so tests of aliasing still see the caller's structs).
func keyed(m map[string]*NodeEntry) map[string]*NodeEntry {
	for name, e := range m {
		if e != nil && e.KeySHA256 == "" {
			e.KeySHA256 = nodeKeyOf(name)
		}
	}
	return m
}

func (p *testPKI) issue(t *testing.T, o certOpts) *x509.Certificate {
	t.Helper()
	key := o.key
	switch {
	case key != nil:
	case len(o.ou) == 1 && o.ou[0] == "node" && o.cn != "":
		key = nodeKey(o.cn)
	default:
		key = newKey(t)
	}
	var uris []*url.URL
	for _, s := range o.uris {
		u, err := url.Parse(s)
		if err != nil {
			t.Fatal(err)
		}
		uris = append(uris, u)
	}
	tmpl := &x509.Certificate{
		SerialNumber: randSerial(t),
		Subject: pkix.Name{
			OrganizationalUnit: o.ou,
			Organization:       o.o,
			CommonName:         o.cn,
		},
		DNSNames:    o.dns,
		URIs:        uris,
		NotBefore:   time.Now().Add(-time.Hour),
		NotAfter:    time.Now().Add(time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, &key.PublicKey, p.key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return cert
}

func (p *testPKI) role(t *testing.T, ou, cn string) *x509.Certificate {
	t.Helper()
	return p.issue(t, certOpts{ou: []string{ou}, cn: cn})
}

// tlsInfo is what gRPC's TLS credentials attach to a connection whose client certificate
// verified against the cluster CA.
func (p *testPKI) tlsInfo(t *testing.T, cert *x509.Certificate) *credentials.TLSInfo {
	t.Helper()
	chains, err := cert.Verify(x509.VerifyOptions{
		Roots:     p.pool,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
	if err != nil {
		t.Fatalf("verify test cert: %v", err)
	}
	return &credentials.TLSInfo{State: tls.ConnectionState{
		HandshakeComplete: true,
		PeerCertificates:  []*x509.Certificate{cert, p.ca},
		VerifiedChains:    chains,
	}}
}

// peerCtx is a server-side call context carrying the TLS peer, as gRPC builds it.
func (p *testPKI) peerCtx(t *testing.T, parent context.Context, cert *x509.Certificate) context.Context {
	t.Helper()
	return peer.NewContext(parent, &peer.Peer{
		Addr:     &net.TCPAddr{IP: net.IPv4(10, 0, 0, 9), Port: 50123},
		AuthInfo: *p.tlsInfo(t, cert),
	})
}

func (p *testPKI) claims(t *testing.T, cert *x509.Certificate) *authorization.Claims {
	t.Helper()
	c, err := claimMapper{}.GetClaims(&authorization.AuthInfo{
		TLSSubject:    &cert.Subject,
		TLSConnection: p.tlsInfo(t, cert),
	})
	if err != nil {
		t.Fatalf("GetClaims: %v", err)
	}
	return c
}

// ---------------------------------------------------------------------------
// identity

func TestIdentityFromCertificate(t *testing.T) {
	pki := newTestPKI(t)
	cases := []struct {
		name string
		opts certOpts
		want string
	}{
		{"node", certOpts{ou: []string{"node"}, cn: "node-0123456789ab"}, "node:node-0123456789ab"},
		{"server", certOpts{ou: []string{"server"}, cn: "srv-42"}, "server:srv-42"},
		{"operator", certOpts{ou: []string{"operator"}, cn: "alice"}, "operator:alice"},
		{"node with SANs keeps OU+CN", certOpts{ou: []string{"node"}, cn: "n1", dns: []string{"server.example"}, uris: []string{"server:s1"}}, "node:n1"},
		{"unknown OU", certOpts{ou: []string{"admin"}, cn: "mallory"}, ""},
		{"OU differs in case", certOpts{ou: []string{"Node"}, cn: "n1"}, ""},
		{"OU with trailing colon", certOpts{ou: []string{"node:"}, cn: "n1"}, ""},
		{"two OUs", certOpts{ou: []string{"node", "server"}, cn: "n1"}, ""},
		{"same OU twice", certOpts{ou: []string{"node", "node"}, cn: "n1"}, ""},
		{"no OU", certOpts{cn: "n1"}, ""},
		{"no CN", certOpts{ou: []string{"node"}}, ""},
		{"no CN, name in DNS SAN", certOpts{ou: []string{"node"}, dns: []string{"n1"}}, ""},
		{"role only in O", certOpts{o: []string{"server"}, cn: "s1"}, ""},
		{"node:x only in DNS SAN", certOpts{dns: []string{"node:x"}}, ""},
		{"node:x only in DNS SAN with a CN", certOpts{cn: "x", dns: []string{"node:x"}}, ""},
		{"node:x only in URI SAN", certOpts{uris: []string{"node:x"}}, ""},
		{"node:x only in CN", certOpts{cn: "node:x"}, ""},
		{"server:x only in CN", certOpts{cn: "server:x"}, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cert := pki.issue(t, tc.opts)
			if got := identity(cert); got != tc.want {
				t.Fatalf("identity(OU=%q CN=%q DNS=%q URI=%q) = %q, want %q",
					cert.Subject.OrganizationalUnit, cert.Subject.CommonName, cert.DNSNames, cert.URIs, got, tc.want)
			}
		})
	}
	if got := identity(nil); got != "" {
		t.Fatalf("identity(nil) = %q, want empty", got)
	}
}

// ---------------------------------------------------------------------------
// claim mapper

func TestClaimMapperRoles(t *testing.T) {
	pki := newTestPKI(t)

	srv := pki.claims(t, pki.role(t, "server", "srv-1"))
	if srv.Subject != "server:srv-1" || srv.System != authorization.RoleAdmin || srv.Extensions != nil {
		t.Fatalf("server claims = %+v, want subject server:srv-1, RoleAdmin, no extensions", srv)
	}
	opCert := pki.role(t, "operator", "alice")
	op := pki.claims(t, opCert)
	// What an operator may do depends on its current certificate, role and tenants: the
	// authorizer decides per call.
	if op.Subject != "operator:alice" || op.System != authorization.RoleUndefined {
		t.Fatalf("operator claims = %+v, want subject operator:alice and no system role", op)
	}
	if got, want := op.Extensions, (operatorCert{name: "alice", serial: opCert.SerialNumber.String()}); got != want {
		t.Fatalf("operator claims extensions = %#v, want %#v", got, want)
	}
	node := pki.claims(t, pki.role(t, "node", "node-0123456789ab"))
	if node.Subject != "node:node-0123456789ab" || node.System != authorization.RoleUndefined {
		t.Fatalf("node claims = %+v, want subject node:node-0123456789ab and no system role", node)
	}
	if got, want := node.Extensions, (nodeCert{id: "node-0123456789ab", key: nodeKeyOf("node-0123456789ab")}); got != want {
		t.Fatalf("node claims extensions = %#v, want %#v", got, want)
	}
	if len(node.Namespaces) != 0 {
		t.Fatalf("node claims carry namespace roles: %v", node.Namespaces)
	}
	for _, c := range []*authorization.Claims{srv, op, node} {
		if c.AuthType != "mtls" {
			t.Fatalf("AuthType = %q, want mtls", c.AuthType)
		}
	}
}

func TestClaimMapperTrustsOnlyVerifiedCertificate(t *testing.T) {
	pki := newTestPKI(t)
	srvCert := pki.role(t, "server", "srv-1")
	nodeCert := pki.role(t, "node", "n1")

	check := func(name string, info *authorization.AuthInfo) {
		t.Helper()
		c, err := claimMapper{}.GetClaims(info)
		if err != nil {
			t.Fatalf("%s: GetClaims: %v", name, err)
		}
		if c == nil {
			t.Fatalf("%s: nil claims", name)
		}
		if c.Subject != "" || c.System != authorization.RoleUndefined || c.Extensions != nil || len(c.Namespaces) != 0 {
			t.Fatalf("%s: claims = %+v, want no identity", name, c)
		}
	}
	check("nil AuthInfo", nil)
	check("empty AuthInfo", &authorization.AuthInfo{})
	// The TLS subject alone (or a bearer token) is not a verified certificate.
	check("subject without TLS connection", &authorization.AuthInfo{TLSSubject: &srvCert.Subject, AuthToken: "Bearer server:srv-1"})
	// A presented but unverified certificate is not trusted either.
	check("unverified peer certificate", &authorization.AuthInfo{
		TLSSubject:    &srvCert.Subject,
		TLSConnection: &credentials.TLSInfo{State: tls.ConnectionState{PeerCertificates: []*x509.Certificate{srvCert}}},
	})
	// A node certificate whose CN/SAN claims another role is still a node (or nothing).
	bad := pki.issue(t, certOpts{cn: "server:srv-1", dns: []string{"server:srv-1"}})
	check("role claimed in CN and SAN", &authorization.AuthInfo{TLSConnection: pki.tlsInfo(t, bad)})

	// The verified certificate wins over a forged TLSSubject.
	c, err := claimMapper{}.GetClaims(&authorization.AuthInfo{
		TLSSubject:    &srvCert.Subject,
		TLSConnection: pki.tlsInfo(t, nodeCert),
	})
	if err != nil {
		t.Fatal(err)
	}
	if c.Subject != "node:n1" || c.System != authorization.RoleUndefined {
		t.Fatalf("claims = %+v, want node:n1 without system role", c)
	}
}

// ---------------------------------------------------------------------------
// authorizer decisions

var (
	apiStartWorkflow   = api.WorkflowServicePrefix + "StartWorkflowExecution"
	apiSignalWorkflow  = api.WorkflowServicePrefix + "SignalWorkflowExecution"
	apiTerminate       = api.WorkflowServicePrefix + "TerminateWorkflowExecution"
	apiListWorkflows   = api.WorkflowServicePrefix + "ListWorkflowExecutions"
	apiCountWorkflows  = api.WorkflowServicePrefix + "CountWorkflowExecutions"
	apiDescribeWF      = api.WorkflowServicePrefix + "DescribeWorkflowExecution"
	apiHistory         = api.WorkflowServicePrefix + "GetWorkflowExecutionHistory"
	apiPollWorkflow    = api.WorkflowServicePrefix + "PollWorkflowTaskQueue"
	apiPollActivity    = api.WorkflowServicePrefix + "PollActivityTaskQueue"
	apiHeartbeat       = api.WorkflowServicePrefix + "RecordActivityTaskHeartbeat"
	apiHeartbeatByID   = api.WorkflowServicePrefix + "RecordActivityTaskHeartbeatById"
	apiCompleted       = api.WorkflowServicePrefix + "RespondActivityTaskCompleted"
	apiCompletedByID   = api.WorkflowServicePrefix + "RespondActivityTaskCompletedById"
	apiFailed          = api.WorkflowServicePrefix + "RespondActivityTaskFailed"
	apiFailedByID      = api.WorkflowServicePrefix + "RespondActivityTaskFailedById"
	apiCanceled        = api.WorkflowServicePrefix + "RespondActivityTaskCanceled"
	apiCanceledByID    = api.WorkflowServicePrefix + "RespondActivityTaskCanceledById"
	apiShutdownWorker  = api.WorkflowServicePrefix + "ShutdownWorker"
	apiWorkerHeartbeat = api.WorkflowServicePrefix + "RecordWorkerHeartbeat"
	apiDescribeTQ      = api.WorkflowServicePrefix + "DescribeTaskQueue"
	apiDescribeNS      = api.WorkflowServicePrefix + "DescribeNamespace"
	apiRegisterNS      = api.WorkflowServicePrefix + "RegisterNamespace"
	apiUpdateNS        = api.WorkflowServicePrefix + "UpdateNamespace"
	apiListNS          = api.WorkflowServicePrefix + "ListNamespaces"
	apiClusterInfo     = api.WorkflowServicePrefix + "GetClusterInfo"
	apiSystemInfo      = api.WorkflowServicePrefix + "GetSystemInfo"
	apiUnknownWF       = api.WorkflowServicePrefix + "NoSuchMethod"
	apiOpAddSA         = api.OperatorServicePrefix + "AddSearchAttributes"
	apiOpListSA        = api.OperatorServicePrefix + "ListSearchAttributes"
	apiOpDeleteNS      = api.OperatorServicePrefix + "DeleteNamespace"
	apiAdminDescribeMS = api.AdminServicePrefix + "DescribeMutableState"
	apiHealthCheck     = healthpb.Health_Check_FullMethodName
)

// requestFor is the request Temporal would hand the authorizer for API on namespace NS:
// the real request type where the node allowlist looks into it, nil otherwise.
func requestFor(apiName, ns string) any {
	switch apiName {
	case apiDescribeNS:
		return &workflowservice.DescribeNamespaceRequest{Namespace: ns}
	case apiStartWorkflow:
		return &workflowservice.StartWorkflowExecutionRequest{Namespace: ns}
	case apiPollWorkflow:
		return &workflowservice.PollWorkflowTaskQueueRequest{Namespace: ns}
	case apiPollActivity:
		return &workflowservice.PollActivityTaskQueueRequest{Namespace: ns}
	case apiShutdownWorker:
		return &workflowservice.ShutdownWorkerRequest{Namespace: ns}
	}
	return nil
}

func authorize(t *testing.T, z authorizer, c *authorization.Claims, apiName, ns string) authorization.Result {
	t.Helper()
	return authorizeRequest(t, z, c, apiName, ns, requestFor(apiName, ns))
}

func authorizeRequest(t *testing.T, z authorizer, c *authorization.Claims, apiName, ns string, req any) authorization.Result {
	t.Helper()
	r, err := z.Authorize(context.Background(), c, &authorization.CallTarget{APIName: apiName, Namespace: ns, Request: req})
	if err != nil {
		t.Fatalf("Authorize(%s, %q): %v", apiName, ns, err)
	}
	return r
}

func decisionName(d authorization.Decision) string {
	switch d {
	case authorization.DecisionAllow:
		return "allow"
	case authorization.DecisionDeny:
		return "deny"
	}
	return "invalid"
}

func TestAuthorizerDecisions(t *testing.T) {
	// Sanity: the API names used below have the metadata these cases rely on.
	for name, want := range map[string]api.MethodMetadata{
		apiStartWorkflow: {Scope: api.ScopeNamespace, Access: api.AccessWrite},
		apiDescribeNS:    {Scope: api.ScopeNamespace, Access: api.AccessReadOnly},
		apiRegisterNS:    {Scope: api.ScopeNamespace, Access: api.AccessAdmin},
		apiListNS:        {Scope: api.ScopeCluster, Access: api.AccessReadOnly},
		apiOpListSA:      {Scope: api.ScopeNamespace, Access: api.AccessReadOnly},
	} {
		md := api.GetMethodMetadata(name)
		if md.Scope != want.Scope || md.Access != want.Access {
			t.Fatalf("metadata of %s = %+v, want scope %v access %v", name, md, want.Scope, want.Access)
		}
	}
	// Every allowlisted name is a real WorkflowService method (a typo would allow nothing).
	for name := range nodeAPIs {
		if md := api.GetMethodMetadata(name); md.Scope != api.ScopeNamespace {
			t.Fatalf("allowlisted %s is not a namespace-scoped WorkflowService method (%+v)", name, md)
		}
	}

	pki := newTestPKI(t)
	table := newAuthz(keyed(map[string]*NodeEntry{
		"node-acme":     {Tenant: "acme", State: "accepted"},
		"node-custom":   {Tenant: "acme", Namespace: "acme-prod", State: "accepted"},
		"node-pending":  {Tenant: "acme", State: "pending"},
		"node-rejected": {Tenant: "acme", State: "rejected"},
		"node-blocked":  {Tenant: "acme", State: "blocked"},
		"node-purging":  {Tenant: "acme", State: "purging"},
		"node-empty":    {Tenant: "acme"},
	}))
	aliceCert := pki.role(t, "operator", "alice")
	table.setOperators(map[string]*OperatorGrant{
		"alice": {Serial: aliceCert.SerialNumber.String(), Role: "admin"},
		"bob":   {Serial: "12345", Role: "admin"},
	})
	z := authorizer{a: table}

	claims := map[string]*authorization.Claims{
		"server":           pki.claims(t, pki.role(t, "server", "srv-1")),
		"operator":         pki.claims(t, aliceCert),
		"operator-old":     pki.claims(t, pki.role(t, "operator", "alice")), // another serial
		"operator-unknown": pki.claims(t, pki.role(t, "operator", "carol")),
		"anon":             nil,
		"nocert":           pki.claims(t, pki.issue(t, certOpts{cn: "node:node-acme"})),
		"foreign":          {Subject: "node:node-acme", Extensions: "node-acme"},                        // not a nodeID
		"writer":           {Subject: "x", System: authorization.RoleWriter | authorization.RoleReader}, // not admin
		"forged-operator":  {Subject: "operator:bob", Extensions: operatorCert{name: "bob"}},            // no serial
	}
	for _, id := range []string{"node-acme", "node-custom", "node-pending", "node-rejected", "node-blocked", "node-purging", "node-empty", "node-unknown"} {
		claims[id] = pki.claims(t, pki.role(t, "node", id))
	}

	const allowD, denyD = authorization.DecisionAllow, authorization.DecisionDeny
	cases := []struct {
		who, api, ns string
		want         authorization.Decision
	}{
		// servers: everything
		{"server", apiStartWorkflow, "acme", allowD},
		{"server", apiStartWorkflow, "default", allowD},
		{"server", apiRegisterNS, "newtenant", allowD},
		{"server", apiListNS, "", allowD},
		{"server", apiOpAddSA, "acme", allowD},
		{"server", apiAdminDescribeMS, "acme", allowD},
		// the operator's current certificate (a cluster-wide admin): reading, no more
		// (authz_operators_test.go has the rest)
		{"operator", apiListWorkflows, "default", allowD},
		{"operator", apiDescribeNS, "acme", allowD},
		{"operator", apiStartWorkflow, "default", denyD},
		{"operator", apiRegisterNS, "newtenant", denyD},
		{"operator", apiListNS, "", denyD},
		{"operator", apiOpDeleteNS, "acme", denyD},
		{"operator", apiAdminDescribeMS, "", denyD},

		// an operator's other certificates (renewed away, replaced), unknown operators
		{"operator-old", apiListNS, "", denyD},
		{"operator-old", apiStartWorkflow, "default", denyD},
		{"operator-old", apiDescribeNS, "default", denyD},
		{"operator-old", apiListWorkflows, "default", denyD},
		{"operator-unknown", apiListNS, "", denyD},
		{"forged-operator", apiListNS, "", denyD},

		// accepted node: its own namespace, only what an activity worker needs
		{"node-acme", apiDescribeNS, "acme", allowD},
		{"node-acme", apiShutdownWorker, "acme", allowD},
		{"node-acme", apiDescribeNS, "default", denyD},
		{"node-acme", apiDescribeNS, "ACME", denyD},
		{"node-acme", apiDescribeNS, "", denyD},
		{"node-acme", apiShutdownWorker, "default", denyD},
		{"node-acme", apiStartWorkflow, "acme", denyD},
		{"node-acme", apiSignalWorkflow, "acme", denyD},
		{"node-acme", apiTerminate, "acme", denyD},
		{"node-acme", apiListWorkflows, "acme", denyD},
		{"node-acme", apiCountWorkflows, "acme", denyD},
		{"node-acme", apiDescribeWF, "acme", denyD},
		{"node-acme", apiHistory, "acme", denyD},
		{"node-acme", apiPollWorkflow, "acme", denyD},
		{"node-acme", apiHeartbeatByID, "acme", denyD},
		{"node-acme", apiCompletedByID, "acme", denyD},
		{"node-acme", apiFailedByID, "acme", denyD},
		{"node-acme", apiCanceledByID, "acme", denyD},
		{"node-acme", apiDescribeTQ, "acme", denyD},
		{"node-acme", apiStartWorkflow, "default", denyD},
		{"node-acme", apiRegisterNS, "acme", denyD},
		{"node-acme", apiUpdateNS, "acme", denyD},
		{"node-acme", apiListNS, "", denyD},
		{"node-acme", apiListNS, "acme", denyD},
		{"node-acme", apiClusterInfo, "acme", denyD},
		{"node-acme", apiUnknownWF, "acme", denyD},
		{"node-acme", apiOpAddSA, "acme", denyD},
		{"node-acme", apiOpListSA, "acme", denyD},
		{"node-acme", apiAdminDescribeMS, "acme", denyD},

		// explicit namespace overrides the tenant
		{"node-custom", apiDescribeNS, "acme-prod", allowD},
		{"node-custom", apiDescribeNS, "acme", denyD},

		// nodes that are not accepted, or unknown
		{"node-unknown", apiDescribeNS, "acme", denyD},
		{"node-pending", apiDescribeNS, "acme", denyD},
		{"node-rejected", apiDescribeNS, "acme", denyD},
		{"node-blocked", apiDescribeNS, "acme", denyD},
		{"node-purging", apiDescribeNS, "acme", denyD},
		{"node-empty", apiDescribeNS, "acme", denyD},

		// no usable identity
		{"anon", apiStartWorkflow, "acme", denyD},
		{"nocert", apiStartWorkflow, "acme", denyD},
		{"foreign", apiDescribeNS, "acme", denyD},
		{"writer", apiStartWorkflow, "acme", denyD},
		{"writer", apiListNS, "", denyD},
	}
	// health checks (and GetSystemInfo) are allowed for everyone
	for who := range claims {
		cases = append(cases,
			struct {
				who, api, ns string
				want         authorization.Decision
			}{who, apiHealthCheck, "", allowD},
			struct {
				who, api, ns string
				want         authorization.Decision
			}{who, apiSystemInfo, "", allowD})
	}

	for _, tc := range cases {
		r := authorize(t, z, claims[tc.who], tc.api, tc.ns)
		if r.Decision != tc.want {
			t.Errorf("%s calling %s on %q: %s (%q), want %s", tc.who, tc.api, tc.ns, decisionName(r.Decision), r.Reason, decisionName(tc.want))
		}
		if r.Decision == authorization.DecisionDeny && r.Reason == "" {
			t.Errorf("%s calling %s on %q: deny without a reason", tc.who, tc.api, tc.ns)
		}
	}
}

// What the allowlist looks at inside the requests a node sends.
func TestNodeRequestChecks(t *testing.T) {
	pki := newTestPKI(t)
	table := newAuthz(keyed(map[string]*NodeEntry{
		"node-a": {Tenant: "acme", State: "accepted"},
		"node-b": {Tenant: "acme", State: "accepted"},
	}))
	z := authorizer{a: table}
	a := pki.claims(t, pki.role(t, "node", "node-a"))
	tq := func(name string) *taskqueuepb.TaskQueue { return &taskqueuepb.TaskQueue{Name: name} }
	cases := []struct {
		name, api string
		req       any
		want      authorization.Decision
	}{
		{"poll own queue", apiPollActivity, &workflowservice.PollActivityTaskQueueRequest{Namespace: "acme", TaskQueue: tq("node-a")}, authorization.DecisionAllow},
		{"poll another node's queue", apiPollActivity, &workflowservice.PollActivityTaskQueueRequest{Namespace: "acme", TaskQueue: tq("node-b")}, authorization.DecisionDeny},
		{"poll a queue named after its own", apiPollActivity, &workflowservice.PollActivityTaskQueueRequest{Namespace: "acme", TaskQueue: tq("node-node-a")}, authorization.DecisionDeny},
		{"poll a partition of its own queue", apiPollActivity, &workflowservice.PollActivityTaskQueueRequest{Namespace: "acme", TaskQueue: tq("/_sys/node-a/1")}, authorization.DecisionDeny},
		{"poll without a queue", apiPollActivity, &workflowservice.PollActivityTaskQueueRequest{Namespace: "acme"}, authorization.DecisionDeny},
		{"poll, no request", apiPollActivity, nil, authorization.DecisionDeny},
		{"poll, wrong request type", apiPollActivity, &workflowservice.PollWorkflowTaskQueueRequest{Namespace: "acme", TaskQueue: tq("node-a")}, authorization.DecisionDeny},
		{"describe by ID", apiDescribeNS, &workflowservice.DescribeNamespaceRequest{Namespace: "acme", Id: "00000000-0000-0000-0000-000000000001"}, authorization.DecisionDeny},
		{"describe, no request", apiDescribeNS, nil, authorization.DecisionDeny},
		{"shutdown own worker", apiShutdownWorker, &workflowservice.ShutdownWorkerRequest{Namespace: "acme", TaskQueue: "node-a", WorkerInstanceKey: "k"}, authorization.DecisionAllow},
		{"shutdown another node's worker", apiShutdownWorker, &workflowservice.ShutdownWorkerRequest{Namespace: "acme", TaskQueue: "node-b", WorkerInstanceKey: "k"}, authorization.DecisionDeny},
		{"shutdown unloading a sticky queue", apiShutdownWorker, &workflowservice.ShutdownWorkerRequest{Namespace: "acme", StickyTaskQueue: "someone-sticky"}, authorization.DecisionDeny},
		{"shutdown with another node's heartbeat", apiShutdownWorker, &workflowservice.ShutdownWorkerRequest{Namespace: "acme", WorkerHeartbeat: &workerpb.WorkerHeartbeat{TaskQueue: "node-b"}}, authorization.DecisionDeny},
		{"report own worker", apiWorkerHeartbeat, &workflowservice.RecordWorkerHeartbeatRequest{Namespace: "acme", WorkerHeartbeat: []*workerpb.WorkerHeartbeat{{TaskQueue: "node-a"}}}, authorization.DecisionAllow},
		{"report another node's worker", apiWorkerHeartbeat, &workflowservice.RecordWorkerHeartbeatRequest{Namespace: "acme", WorkerHeartbeat: []*workerpb.WorkerHeartbeat{{TaskQueue: "node-a"}, {TaskQueue: "node-b"}}}, authorization.DecisionDeny},
		{"report a worker of no queue", apiWorkerHeartbeat, &workflowservice.RecordWorkerHeartbeatRequest{Namespace: "acme", WorkerHeartbeat: []*workerpb.WorkerHeartbeat{{}}}, authorization.DecisionDeny},
		{"report, no request", apiWorkerHeartbeat, nil, authorization.DecisionDeny},
		{"heartbeat a token it was never given", apiHeartbeat, &workflowservice.RecordActivityTaskHeartbeatRequest{Namespace: "acme", TaskToken: []byte("forged")}, authorization.DecisionDeny},
		{"heartbeat without a token", apiHeartbeat, &workflowservice.RecordActivityTaskHeartbeatRequest{Namespace: "acme"}, authorization.DecisionDeny},
		{"complete a token it was never given", apiCompleted, &workflowservice.RespondActivityTaskCompletedRequest{Namespace: "acme", TaskToken: []byte("forged")}, authorization.DecisionDeny},
	}
	for _, tc := range cases {
		if r := authorizeRequest(t, z, a, tc.api, "acme", tc.req); r.Decision != tc.want {
			t.Errorf("%s: %s (%q), want %s", tc.name, decisionName(r.Decision), r.Reason, decisionName(tc.want))
		}
	}
}

func TestAuthorizerFollowsTableUpdates(t *testing.T) {
	pki := newTestPKI(t)
	table := newAuthz(keyed(map[string]*NodeEntry{
		"n1": {Tenant: "acme", State: "accepted"},
		"n2": {Tenant: "beta", State: "accepted"},
	}))
	z := authorizer{a: table}
	c1 := pki.claims(t, pki.role(t, "node", "n1"))
	c2 := pki.claims(t, pki.role(t, "node", "n2"))
	c3 := pki.claims(t, pki.role(t, "node", "n3"))

	expect := func(step string, c *authorization.Claims, ns string, want authorization.Decision) {
		t.Helper()
		if r := authorize(t, z, c, apiDescribeNS, ns); r.Decision != want {
			t.Fatalf("%s: %s on %q = %s (%q), want %s", step, c.Subject, ns, decisionName(r.Decision), r.Reason, decisionName(want))
		}
	}
	expect("initial", c1, "acme", authorization.DecisionAllow)
	expect("initial", c2, "beta", authorization.DecisionAllow)
	expect("initial", c3, "acme", authorization.DecisionDeny)

	// block n1 with a merge: n2 is untouched
	table.update(keyed(map[string]*NodeEntry{"n1": {Tenant: "acme", State: "blocked"}}), false)
	expect("after block", c1, "acme", authorization.DecisionDeny)
	expect("after block (merge keeps others)", c2, "beta", authorization.DecisionAllow)
	if table.size() != 2 {
		t.Fatalf("size after merge = %d, want 2", table.size())
	}

	// unblock n1
	table.update(keyed(map[string]*NodeEntry{"n1": {Tenant: "acme", State: "accepted"}}), false)
	expect("after unblock", c1, "acme", authorization.DecisionAllow)

	// move n1 to another namespace
	table.update(keyed(map[string]*NodeEntry{"n1": {Tenant: "acme", Namespace: "acme-2", State: "accepted"}}), false)
	expect("after namespace change", c1, "acme", authorization.DecisionDeny)
	expect("after namespace change", c1, "acme-2", authorization.DecisionAllow)

	// a nil entry deletes the node, others stay
	table.update(keyed(map[string]*NodeEntry{"n1": nil, "n3": {Tenant: "acme", State: "accepted"}}), false)
	expect("after delete", c1, "acme-2", authorization.DecisionDeny)
	expect("after delete", c2, "beta", authorization.DecisionAllow)
	expect("after add", c3, "acme", authorization.DecisionAllow)
	if table.lookup("n1") != nil {
		t.Fatalf("n1 still in the table after a nil entry")
	}
	if table.size() != 2 {
		t.Fatalf("size after delete+add = %d, want 2", table.size())
	}
	// deleting an absent node is harmless
	table.update(keyed(map[string]*NodeEntry{"nobody": nil}), false)
	if table.size() != 2 {
		t.Fatalf("size after deleting an absent node = %d, want 2", table.size())
	}

	// replace swaps the whole table
	table.update(keyed(map[string]*NodeEntry{"n1": {Tenant: "acme", State: "accepted"}}), true)
	expect("after replace", c1, "acme", authorization.DecisionAllow)
	expect("after replace", c2, "beta", authorization.DecisionDeny)
	expect("after replace", c3, "acme", authorization.DecisionDeny)
	if table.size() != 1 {
		t.Fatalf("size after replace = %d, want 1", table.size())
	}
	table.update(nil, true)
	expect("after replace with nothing", c1, "acme", authorization.DecisionDeny)
	if table.size() != 0 {
		t.Fatalf("size after empty replace = %d, want 0", table.size())
	}
}

func TestAuthzUpdateCopiesEntries(t *testing.T) {
	pki := newTestPKI(t)
	initial := &NodeEntry{Tenant: "acme", State: "accepted"}
	table := newAuthz(keyed(map[string]*NodeEntry{"n1": initial}))
	pushed := &NodeEntry{Tenant: "beta", State: "accepted"}
	table.update(keyed(map[string]*NodeEntry{"n2": pushed}), false)

	// The caller's structs are not aliased by the table.
	initial.State = "blocked"
	pushed.Namespace = "elsewhere"

	z := authorizer{a: table}
	if r := authorize(t, z, pki.claims(t, pki.role(t, "node", "n1")), apiDescribeNS, "acme"); r.Decision != authorization.DecisionAllow {
		t.Fatalf("n1 denied after the caller mutated its own struct: %q", r.Reason)
	}
	if r := authorize(t, z, pki.claims(t, pki.role(t, "node", "n2")), apiDescribeNS, "beta"); r.Decision != authorization.DecisionAllow {
		t.Fatalf("n2 denied after the caller mutated its own struct: %q", r.Reason)
	}
}

func TestNodeEntryAllows(t *testing.T) {
	var nilEntry *NodeEntry
	cases := []struct {
		e    *NodeEntry
		ns   string
		want bool
	}{
		{nilEntry, "acme", false},
		{&NodeEntry{Tenant: "acme", State: "accepted"}, "acme", true},
		{&NodeEntry{Tenant: "acme", State: "accepted"}, "", false},
		{&NodeEntry{State: "accepted"}, "", false},
		{&NodeEntry{Tenant: "acme", State: "accepted"}, "beta", false},
		{&NodeEntry{Tenant: "acme", Namespace: "ns1", State: "accepted"}, "ns1", true},
		{&NodeEntry{Tenant: "acme", Namespace: "ns1", State: "accepted"}, "acme", false},
		{&NodeEntry{Tenant: "acme", State: "Accepted"}, "acme", false},
		{&NodeEntry{Tenant: "acme", State: "blocked"}, "acme", false},
	}
	for _, tc := range cases {
		if got := tc.e.allows(tc.ns); got != tc.want {
			t.Errorf("%+v.allows(%q) = %v, want %v", tc.e, tc.ns, got, tc.want)
		}
	}
}

// ---------------------------------------------------------------------------
// interceptor: in-flight calls are cut when a node loses access

var pollInfo = &grpc.UnaryServerInfo{FullMethod: apiPollWorkflow}

type inflight struct {
	ctx     context.Context // the handler's context
	release chan struct{}
	done    chan error
}

// startCall runs table.interceptor in its own goroutine with a handler that blocks until its
// context ends or release is closed, and waits until the handler is running.
func startCall(t *testing.T, table *authz, ctx context.Context) *inflight {
	t.Helper()
	return startCallOf(t, table, ctx, pollInfo, "req")
}

// startCallOf is startCall for the call INFO with the request REQ.
func startCallOf(t *testing.T, table *authz, ctx context.Context, info *grpc.UnaryServerInfo, req any) *inflight {
	t.Helper()
	c := &inflight{release: make(chan struct{}), done: make(chan error, 1)}
	started := make(chan context.Context, 1)
	handler := func(hctx context.Context, req any) (any, error) {
		started <- hctx
		select {
		case <-hctx.Done():
			return nil, hctx.Err()
		case <-c.release:
			return "ok", nil
		}
	}
	go func() {
		resp, err := table.interceptor(ctx, req, info, handler)
		if err == nil && resp != "ok" {
			err = errors.New("unexpected response")
		}
		c.done <- err
	}()
	select {
	case c.ctx = <-started:
	case <-time.After(5 * time.Second):
		t.Fatal("handler not called")
	}
	return c
}

func (c *inflight) wait(t *testing.T) error {
	t.Helper()
	select {
	case err := <-c.done:
		return err
	case <-time.After(5 * time.Second):
		t.Fatal("call still in flight")
		return nil
	}
}

// expectCancelled checks the call was cut, its handler saw its context end, and its caller
// was told PermissionDenied (not the context.Canceled the handler returned).
func (c *inflight) expectCancelled(t *testing.T) {
	t.Helper()
	err := c.wait(t)
	if !errors.Is(c.ctx.Err(), context.Canceled) {
		t.Fatalf("handler context = %v, want cancelled", c.ctx.Err())
	}
	if !isPermissionDenied(err) {
		t.Fatalf("call returned %v, want PermissionDenied", err)
	}
}

// expectLive checks the call is still running, then lets it finish normally.
func (c *inflight) expectLive(t *testing.T) {
	t.Helper()
	if err := c.ctx.Err(); err != nil {
		t.Fatalf("call context ended: %v", err)
	}
	select {
	case err := <-c.done:
		t.Fatalf("call ended early: %v", err)
	default:
	}
	close(c.release)
	if err := c.wait(t); err != nil {
		t.Fatalf("call returned %v, want success", err)
	}
}

func trackedCalls(table *authz) int {
	table.mu.RLock()
	defer table.mu.RUnlock()
	n := 0
	for _, m := range table.calls {
		n += len(m)
	}
	return n
}

func TestInterceptorCancelsCallWhenNodeLosesAccess(t *testing.T) {
	base := func() map[string]*NodeEntry {
		return map[string]*NodeEntry{
			"n1": {Tenant: "acme", State: "accepted"},
			"n2": {Tenant: "beta", State: "accepted"},
		}
	}
	cases := []struct {
		name    string
		nodes   map[string]*NodeEntry
		replace bool
	}{
		{"blocked", map[string]*NodeEntry{"n1": {Tenant: "acme", State: "blocked"}}, false},
		{"pending", map[string]*NodeEntry{"n1": {Tenant: "acme", State: "pending"}}, false},
		{"purging", map[string]*NodeEntry{"n1": {Tenant: "acme", State: "purging"}}, false},
		{"deleted by nil entry", map[string]*NodeEntry{"n1": nil}, false},
		{"tenant changed", map[string]*NodeEntry{"n1": {Tenant: "other", State: "accepted"}}, false},
		{"namespace changed", map[string]*NodeEntry{"n1": {Tenant: "acme", Namespace: "acme-2", State: "accepted"}}, false},
		{"dropped by replace", map[string]*NodeEntry{"n2": {Tenant: "beta", State: "accepted"}}, true},
		{"replaced by empty table", nil, true},
	}
	pki := newTestPKI(t)
	n1 := pki.role(t, "node", "n1")
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			table := newAuthz(keyed(base()))
			parent, cancelParent := context.WithCancel(context.Background())
			defer cancelParent()
			call := startCall(t, table, pki.peerCtx(t, parent, n1))
			if got := trackedCalls(table); got != 1 {
				t.Fatalf("tracked calls = %d, want 1", got)
			}
			// The handler still sees the caller's peer.
			if p, ok := peer.FromContext(call.ctx); !ok || p.AuthInfo == nil {
				t.Fatal("handler context lost the TLS peer")
			}

			updated := make(chan int, 1)
			go func() { updated <- table.update(keyed(tc.nodes), tc.replace) }()
			var n int
			select {
			case n = <-updated:
			case <-time.After(5 * time.Second):
				t.Fatal("update blocked")
			}
			if n != 1 {
				t.Fatalf("update cancelled %d calls, want 1", n)
			}
			call.expectCancelled(t)
			if parent.Err() != nil {
				t.Fatal("the caller's own context was cancelled")
			}
			if got := trackedCalls(table); got != 0 {
				t.Fatalf("tracked calls after cancel = %d, want 0", got)
			}
			// Nothing left to cancel.
			if n := table.update(keyed(map[string]*NodeEntry{"n1": nil}), false); n != 0 {
				t.Fatalf("second update cancelled %d calls, want 0", n)
			}
		})
	}
}

func TestInterceptorKeepsCallWhileNodeKeepsAccess(t *testing.T) {
	cases := []struct {
		name    string
		nodes   map[string]*NodeEntry
		replace bool
	}{
		{"no change", nil, false},
		{"same entry pushed again", map[string]*NodeEntry{"n1": {Tenant: "acme", State: "accepted"}}, false},
		{"same entry in a replace", map[string]*NodeEntry{"n1": {Tenant: "acme", State: "accepted"}}, true},
		{"other node blocked", map[string]*NodeEntry{"n2": {Tenant: "beta", State: "blocked"}}, false},
		{"other node deleted", map[string]*NodeEntry{"n2": nil}, false},
		{"tenant renamed, same namespace", map[string]*NodeEntry{"n1": {Tenant: "acme-corp", Namespace: "acme", State: "accepted"}}, false},
	}
	pki := newTestPKI(t)
	n1 := pki.role(t, "node", "n1")
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			table := newAuthz(keyed(map[string]*NodeEntry{
				"n1": {Tenant: "acme", State: "accepted"},
				"n2": {Tenant: "beta", State: "accepted"},
			}))
			call := startCall(t, table, pki.peerCtx(t, context.Background(), n1))
			if n := table.update(keyed(tc.nodes), tc.replace); n != 0 {
				t.Fatalf("update cancelled %d calls, want 0", n)
			}
			call.expectLive(t)
			if got := trackedCalls(table); got != 0 {
				t.Fatalf("tracked calls after the call returned = %d, want 0", got)
			}
		})
	}
}

func TestInterceptorReportsOnlyItsOwnCutsAsWithdrawn(t *testing.T) {
	pki := newTestPKI(t)
	n1 := pki.role(t, "node", "n1")
	accepted := func() *authz {
		return newAuthz(keyed(map[string]*NodeEntry{"n1": {Tenant: "acme", State: "accepted"}}))
	}

	// The caller hung up: its own cancellation comes back as it was.
	table := accepted()
	parent, cancelParent := context.WithCancel(context.Background())
	call := startCall(t, table, pki.peerCtx(t, parent, n1))
	cancelParent()
	if err := call.wait(t); !errors.Is(err, context.Canceled) || isPermissionDenied(err) {
		t.Fatalf("caller's own cancel returned %v, want context.Canceled", err)
	}

	// A handler that finishes despite the cut keeps its answer.
	table = accepted()
	ctx := pki.peerCtx(t, context.Background(), n1)
	started := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		resp, err := table.interceptor(ctx, "req", pollInfo, func(hctx context.Context, _ any) (any, error) {
			close(started)
			<-hctx.Done()
			return "task", nil
		})
		if err == nil && resp != "task" {
			err = fmt.Errorf("response %v, want task", resp)
		}
		done <- err
	}()
	<-started
	if n := table.update(keyed(map[string]*NodeEntry{"n1": {Tenant: "acme", State: "blocked"}}), false); n != 1 {
		t.Fatalf("update cancelled %d calls, want 1", n)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("finished call returned %v, want its answer", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("call still in flight")
	}
}

func TestInterceptorCancelsOnlyTheAffectedNode(t *testing.T) {
	pki := newTestPKI(t)
	table := newAuthz(keyed(map[string]*NodeEntry{
		"n1": {Tenant: "acme", State: "accepted"},
		"n2": {Tenant: "acme", State: "accepted"},
	}))
	n1, n2 := pki.role(t, "node", "n1"), pki.role(t, "node", "n2")
	a := startCall(t, table, pki.peerCtx(t, context.Background(), n1))
	b := startCall(t, table, pki.peerCtx(t, context.Background(), n1))
	c := startCall(t, table, pki.peerCtx(t, context.Background(), n2))
	if got := trackedCalls(table); got != 3 {
		t.Fatalf("tracked calls = %d, want 3", got)
	}
	if n := table.update(keyed(map[string]*NodeEntry{"n1": {Tenant: "acme", State: "blocked"}}), false); n != 2 {
		t.Fatalf("update cancelled %d calls, want 2", n)
	}
	a.expectCancelled(t)
	b.expectCancelled(t)
	c.expectLive(t)
	if got := trackedCalls(table); got != 0 {
		t.Fatalf("tracked calls = %d, want 0", got)
	}
}

func TestInterceptorDoesNotTrackOtherCallers(t *testing.T) {
	pki := newTestPKI(t)
	table := newAuthz(keyed(map[string]*NodeEntry{"n1": {Tenant: "acme", State: "accepted"}}))
	nodeCert := pki.role(t, "node", "n1")
	unverified := peer.NewContext(context.Background(), &peer.Peer{
		Addr:     &net.TCPAddr{IP: net.IPv4(10, 0, 0, 9), Port: 1},
		AuthInfo: credentials.TLSInfo{State: tls.ConnectionState{PeerCertificates: []*x509.Certificate{nodeCert}}},
	})
	ctxs := map[string]context.Context{
		"server":             pki.peerCtx(t, context.Background(), pki.role(t, "server", "srv-1")),
		"no peer":            context.Background(),
		"unverified node":    unverified,
		"node:n1 only in CN": pki.peerCtx(t, context.Background(), pki.issue(t, certOpts{cn: "node:n1"})),
	}
	for name, ctx := range ctxs {
		t.Run(name, func(t *testing.T) {
			call := startCall(t, table, ctx)
			if got := trackedCalls(table); got != 0 {
				t.Fatalf("tracked calls = %d, want 0", got)
			}
			if n := table.update(nil, true); n != 0 {
				t.Fatalf("update cancelled %d calls, want 0", n)
			}
			call.expectLive(t)
			table.update(keyed(map[string]*NodeEntry{"n1": {Tenant: "acme", State: "accepted"}}), true)
		})
	}
}

func TestInterceptorPassesThroughResultAndError(t *testing.T) {
	pki := newTestPKI(t)
	table := newAuthz(keyed(map[string]*NodeEntry{"n1": {Tenant: "acme", State: "accepted"}}))
	ctx := pki.peerCtx(t, context.Background(), pki.role(t, "node", "n1"))
	boom := errors.New("boom")
	resp, err := table.interceptor(ctx, "in", pollInfo, func(ctx context.Context, req any) (any, error) {
		if req != "in" {
			t.Errorf("handler got request %v", req)
		}
		return "out", boom
	})
	if resp != "out" || !errors.Is(err, boom) {
		t.Fatalf("interceptor returned (%v, %v), want (out, boom)", resp, err)
	}
	if got := trackedCalls(table); got != 0 {
		t.Fatalf("tracked calls after return = %d, want 0", got)
	}
	// The call is over: a later block has nothing to cancel.
	if n := table.update(keyed(map[string]*NodeEntry{"n1": {Tenant: "acme", State: "blocked"}}), false); n != 0 {
		t.Fatalf("update cancelled %d calls, want 0", n)
	}
}

// ---------------------------------------------------------------------------
// the "authz" command as the parent sends it

func TestHandleAuthzCommand(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "protocol"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	outMu.Lock()
	saved := out
	out = f
	outMu.Unlock()
	t.Cleanup(func() {
		outMu.Lock()
		out = saved
		outMu.Unlock()
	})

	pki := newTestPKI(t)
	table := newAuthz(nil)
	stopCh := make(chan string, 1)
	z := authorizer{a: table}
	c1 := pki.claims(t, pki.role(t, "node", "n1"))
	c2 := pki.claims(t, pki.role(t, "node", "n2"))

	handleCommand([]byte(fmt.Sprintf(`{"id":2,"op":"authz","replace":true,"nodes":{"n1":{"tenant":"default","state":"accepted","keySha256":%q},"n2":{"tenant":"acme","state":"accepted","keySha256":%q}}}`, nodeKeyOf("n1"), nodeKeyOf("n2"))), table, nil, stopCh)
	if r := authorize(t, z, c1, apiDescribeNS, "default"); r.Decision != authorization.DecisionAllow {
		t.Fatalf("n1 denied after authz replace: %q", r.Reason)
	}
	if r := authorize(t, z, c2, apiDescribeNS, "acme"); r.Decision != authorization.DecisionAllow {
		t.Fatalf("n2 denied after authz replace: %q", r.Reason)
	}

	call := startCall(t, table, pki.peerCtx(t, context.Background(), pki.role(t, "node", "n1")))
	handleCommand([]byte(fmt.Sprintf(`{"id":3,"op":"authz","nodes":{"n1":{"tenant":"default","state":"blocked","keySha256":%q},"n2":null}}`, nodeKeyOf("n1"))), table, nil, stopCh)
	call.expectCancelled(t)
	if r := authorize(t, z, c1, apiDescribeNS, "default"); r.Decision != authorization.DecisionDeny {
		t.Fatal("n1 allowed after being blocked")
	}
	if r := authorize(t, z, c2, apiDescribeNS, "acme"); r.Decision != authorization.DecisionDeny {
		t.Fatal("n2 allowed after a null entry")
	}
	if table.lookup("n2") != nil {
		t.Fatal("n2 still in the table after a null entry")
	}

	if _, err := f.Seek(0, 0); err != nil {
		t.Fatal(err)
	}
	var acks []map[string]any
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("bad protocol line %q: %v", sc.Text(), err)
		}
		acks = append(acks, m)
	}
	want := []map[string]any{
		{"ack": 2.0, "nodes": 2.0, "cancelledCalls": 0.0},
		{"ack": 3.0, "nodes": 1.0, "cancelledCalls": 1.0},
	}
	if len(acks) != len(want) {
		t.Fatalf("acks = %v, want %v", acks, want)
	}
	for i := range want {
		for k, v := range want[i] {
			if acks[i][k] != v {
				t.Fatalf("ack %d = %v, want %v", i, acks[i], want[i])
			}
		}
		if _, hasErr := acks[i]["error"]; hasErr {
			t.Fatalf("ack %d carries an error: %v", i, acks[i])
		}
	}
	select {
	case r := <-stopCh:
		t.Fatalf("authz command requested a stop: %q", r)
	default:
	}
}

func TestUpdateCountsEachCancelledCallOnce(t *testing.T) {
	pki := newTestPKI(t)
	table := newAuthz(keyed(map[string]*NodeEntry{"n1": {Tenant: "acme", State: "accepted"}}))
	ctx := pki.peerCtx(t, context.Background(), pki.role(t, "node", "n1"))
	// A handler slow to notice cancellation is still running during the next update.
	release := make(chan struct{})
	started := make(chan context.Context, 1)
	done := make(chan error, 1)
	go func() {
		_, err := table.interceptor(ctx, "req", pollInfo, func(hctx context.Context, req any) (any, error) {
			started <- hctx
			<-release
			return nil, hctx.Err()
		})
		done <- err
	}()
	var hctx context.Context
	select {
	case hctx = <-started:
	case <-time.After(5 * time.Second):
		t.Fatal("handler not called")
	}
	if n := table.update(keyed(map[string]*NodeEntry{"n1": {Tenant: "acme", State: "blocked"}}), false); n != 1 {
		t.Fatalf("first update cancelled %d calls, want 1", n)
	}
	if hctx.Err() == nil {
		t.Fatal("call context not cancelled")
	}
	if n := table.update(keyed(map[string]*NodeEntry{"n1": nil}), false); n != 0 {
		t.Fatalf("second update cancelled %d calls, want 0 (already cancelled)", n)
	}
	close(release)
	select {
	case err := <-done:
		if !isPermissionDenied(err) {
			t.Fatalf("call returned %v, want PermissionDenied", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("call still in flight")
	}
	if got := trackedCalls(table); got != 0 {
		t.Fatalf("tracked calls = %d, want 0", got)
	}
}

// nsRequest stands for a WorkflowService request: every one names its namespace.
type nsRequest struct{ ns string }

func (r nsRequest) GetNamespace() string { return r.ns }

// A block that lands after Temporal's authorizer allowed a call but before the call is
// tracked must still stop it: the interceptor looks at the table again.
func TestInterceptorRefusesACallAuthorizedJustBeforeABlock(t *testing.T) {
	pki := newTestPKI(t)
	table := newAuthz(keyed(map[string]*NodeEntry{"n1": {Tenant: "acme", State: "accepted"}}))
	ctx := pki.peerCtx(t, context.Background(), pki.role(t, "node", "n1"))
	handler := func(context.Context, any) (any, error) { return "ran", nil }

	if resp, err := table.interceptor(ctx, nsRequest{"acme"}, pollInfo, handler); err != nil || resp != "ran" {
		t.Fatalf("accepted node: got (%v, %v), want (ran, nil)", resp, err)
	}
	table.update(keyed(map[string]*NodeEntry{"n1": {Tenant: "acme", State: "blocked"}}), false)
	resp, err := table.interceptor(ctx, nsRequest{"acme"}, pollInfo, func(context.Context, any) (any, error) {
		t.Error("handler ran for a blocked node")
		return nil, nil
	})
	if resp != nil || !isPermissionDenied(err) {
		t.Fatalf("blocked node: got (%v, %v), want PermissionDenied", resp, err)
	}
	if resp, err := table.interceptor(ctx, nsRequest{"default"}, pollInfo, handler); !isPermissionDenied(err) {
		t.Fatalf("other namespace: got (%v, %v), want PermissionDenied", resp, err)
	}
	if got := trackedCalls(table); got != 0 {
		t.Fatalf("tracked calls = %d, want 0", got)
	}
}

func isPermissionDenied(err error) bool {
	var pd *serviceerror.PermissionDenied
	return errors.As(err, &pd)
}

func TestInterceptorLeavesHealthChecksAlone(t *testing.T) {
	pki := newTestPKI(t)
	table := newAuthz(nil) // no operators: this certificate is not admin
	ctx := pki.peerCtx(t, context.Background(), pki.role(t, "operator", "alice"))
	for _, method := range []string{apiSystemInfo, apiHealthCheck} {
		resp, err := table.interceptor(ctx, "req", &grpc.UnaryServerInfo{FullMethod: method}, func(context.Context, any) (any, error) {
			return "ran", nil
		})
		if err != nil || resp != "ran" {
			t.Fatalf("%s: (%v, %v), want (ran, nil)", method, resp, err)
		}
	}
	if _, err := table.interceptor(ctx, "req", pollInfo, func(context.Context, any) (any, error) { return "ran", nil }); !isPermissionDenied(err) {
		t.Fatalf("a call by a certificate that is not current: %v, want PermissionDenied", err)
	}
}
