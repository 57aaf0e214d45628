package main

import (
	"context"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"strings"
	"testing"
	"time"

	taskqueuepb "go.temporal.io/api/taskqueue/v1"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/server/common/authorization"
)

// A node calls only with the certificate for the key its row holds now: after a renewal
// (a new key) the old certificate is refused and its calls in flight are cut.

// renewedCert is a certificate for node NAME with a key of its own, as a renewal issues it.
func (p *testPKI) renewedCert(t *testing.T, name string) (*x509.Certificate, string) {
	t.Helper()
	key := newKey(t)
	return p.issue(t, certOpts{ou: []string{"node"}, cn: name, key: key}), keySHA256(key)
}

func TestOnlyTheNodesCurrentCertificateMayCall(t *testing.T) {
	pki := newTestPKI(t)
	table := newAuthz(keyed(map[string]*NodeEntry{"n1": {Tenant: "acme", State: "accepted"}}))
	z := authorizer{a: table}
	joined := pki.role(t, "node", "n1")
	reissued := pki.role(t, "node", "n1") // same key, another serial (accept after a pending join)
	renewed, renewedKey := pki.renewedCert(t, "n1")
	expect := func(step string, cert *x509.Certificate, want authorization.Decision, reason string) {
		t.Helper()
		r := authorize(t, z, pki.claims(t, cert), apiDescribeNS, "acme")
		if r.Decision != want || (reason != "" && r.Reason != reason) {
			t.Fatalf("%s: %s (%q), want %s %q", step, decisionName(r.Decision), r.Reason, decisionName(want), reason)
		}
	}
	const notCurrent = "node certificate is not the node's current one"
	expect("the certificate of the joined key", joined, authorization.DecisionAllow, "")
	expect("another certificate for the same key", reissued, authorization.DecisionAllow, "")
	expect("renewed, not yet pushed", renewed, authorization.DecisionDeny, notCurrent)

	table.update(map[string]*NodeEntry{"n1": {Tenant: "acme", State: "accepted", KeySHA256: renewedKey}}, false)
	expect("after the renewal, the old certificate", joined, authorization.DecisionDeny, notCurrent)
	expect("after the renewal, the old key's other certificate", reissued, authorization.DecisionDeny, notCurrent)
	expect("after the renewal, the new certificate", renewed, authorization.DecisionAllow, "")

	// The key is compared as the hex it is, whatever its case.
	table.update(map[string]*NodeEntry{"n1": {Tenant: "acme", State: "accepted", KeySHA256: strings.ToUpper(renewedKey)}}, true)
	expect("key pushed in upper case", renewed, authorization.DecisionAllow, "")

	// No key on record (no certificate issued yet): no certificate may call.
	table.update(map[string]*NodeEntry{"n1": {Tenant: "acme", State: "accepted"}}, true)
	expect("no key on record", renewed, authorization.DecisionDeny, notCurrent)
	expect("no key on record, the joined key", joined, authorization.DecisionDeny, notCurrent)
}

// The host names a certificate's key exactly as the Python side's nodes.public_key_sha256
// (a value it computed for this key).
func TestKeyOfAgreesWithTheNodesTable(t *testing.T) {
	const spki = `-----BEGIN PUBLIC KEY-----
MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE0zL7Xz3+gBIZwinuJaWBVWM8GFwG
FyFl42QXqB3/Pem5Ukq76BM2lPsAqOM8VzpSqE8iTKxoJx74BSzIL68TGA==
-----END PUBLIC KEY-----`
	const fromPython = "f1b02f5dc22a3a03828a190c2774448b7283c72daae349a988ba28c6c9a273fa"
	block, _ := pem.Decode([]byte(spki))
	pub, err := x509.ParsePKIXPublicKey(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	pki := newTestPKI(t)
	tmpl := &x509.Certificate{
		SerialNumber: randSerial(t),
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, pki.ca, pub, pki.key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	if got := keyOf(cert); got != fromPython {
		t.Fatalf("keyOf = %s, want %s", got, fromPython)
	}
	if got, want := keyOf(pki.role(t, "node", "n1")), nodeKeyOf("n1"); got != want {
		t.Fatalf("keyOf = %s, want %s", got, want)
	}
}

func TestARenewalCancelsCallsOfTheOldNodeCertificateOnly(t *testing.T) {
	pki := newTestPKI(t)
	table := newAuthz(keyed(map[string]*NodeEntry{
		"n1": {Tenant: "acme", State: "accepted"},
		"n2": {Tenant: "acme", State: "accepted"},
	}))
	renewed, renewedKey := pki.renewedCert(t, "n1")
	old := startCall(t, table, pki.peerCtx(t, context.Background(), pki.role(t, "node", "n1")))
	other := startCall(t, table, pki.peerCtx(t, context.Background(), pki.role(t, "node", "n2")))
	after := map[string]*NodeEntry{"n1": {Tenant: "acme", State: "accepted", KeySHA256: renewedKey}}
	if n := table.update(after, false); n != 1 {
		t.Fatalf("the renewal cancelled %d calls, want 1", n)
	}
	old.expectCancelled(t)
	other.expectLive(t)
	current := startCall(t, table, pki.peerCtx(t, context.Background(), renewed))
	if n := table.update(after, false); n != 0 {
		t.Fatalf("pushing the same key again cancelled %d calls", n)
	}
	if n := table.update(keyed(map[string]*NodeEntry{"n2": {Tenant: "acme", State: "accepted"}, "n1": after["n1"]}), true); n != 0 {
		t.Fatalf("a replace with the same keys cancelled %d calls", n)
	}
	current.expectLive(t)
}

// A renewal landing after Temporal's authorizer allowed a call, before it is tracked.
func TestInterceptorRefusesANodeCallAfterARenewal(t *testing.T) {
	pki := newTestPKI(t)
	renewed, renewedKey := pki.renewedCert(t, "n1")
	table := newAuthz(map[string]*NodeEntry{"n1": {Tenant: "acme", State: "accepted", KeySHA256: renewedKey}})
	ran := false
	_, err := table.interceptor(pki.peerCtx(t, context.Background(), pki.role(t, "node", "n1")), nsRequest{"acme"}, pollInfo, func(context.Context, any) (any, error) {
		ran = true
		return nil, nil
	})
	if !isPermissionDenied(err) || ran {
		t.Fatalf("the old certificate's call ran (err %v)", err)
	}
	resp, err := table.interceptor(pki.peerCtx(t, context.Background(), renewed), nsRequest{"acme"}, pollInfo, func(context.Context, any) (any, error) {
		return "ran", nil
	})
	if err != nil || resp != "ran" {
		t.Fatalf("the current certificate: (%v, %v), want (ran, nil)", resp, err)
	}
}

// Tasks the old certificate was given are not the new one's to answer, and a poll of the old
// certificate that returns after the renewal hands it nothing to keep.
func TestARenewalForgetsTheOldCertificatesTasks(t *testing.T) {
	n := newNodeCall(t)
	n.poll("node-a", []byte("t1"), nil)
	renewed, renewedKey := n.pki.renewedCert(t, "node-a")
	n.table.update(map[string]*NodeEntry{"node-a": {Tenant: "acme", State: "accepted", KeySHA256: renewedKey}}, false)
	z := authorizer{a: n.table}
	if r := authorizeRequest(t, z, n.pki.claims(t, renewed), apiHeartbeat, "acme", heartbeat([]byte("t1"))); r.Decision != authorization.DecisionDeny {
		t.Fatal("the renewed certificate may answer a task the old one was given")
	}

	poll := &workflowservice.PollActivityTaskQueueRequest{Namespace: "acme", TaskQueue: &taskqueuepb.TaskQueue{Name: "node-a"}}
	got := &workflowservice.PollActivityTaskQueueResponse{TaskToken: []byte("t2")}
	n.table.noteTaskTokens(caller{role: "node", name: "node-a", cert: nodeKeyOf("node-a")}, poll, got, nil)
	if n.table.nodeHoldsToken("node-a", []byte("t2")) {
		t.Fatal("a poll of the renewed-away certificate left its task to the node")
	}
	n.table.noteTaskTokens(caller{role: "node", name: "node-a", cert: renewedKey}, poll, got, nil)
	if r := authorizeRequest(t, z, n.pki.claims(t, renewed), apiHeartbeat, "acme", heartbeat([]byte("t2"))); r.Decision != authorization.DecisionAllow {
		t.Fatalf("the current certificate may not heartbeat its own task: %q", r.Reason)
	}
}

func TestConfigNodesCarryTheirKeys(t *testing.T) {
	c, err := parseConfig([]byte(`{"advertise":"127.0.0.1","nodes":{"n1":{"tenant":"acme","state":"accepted","keySha256":"ab12"}}}`))
	if err != nil {
		t.Fatal(err)
	}
	if e := c.Nodes["n1"]; e == nil || e.KeySHA256 != "ab12" {
		t.Fatalf("nodes = %v", c.Nodes)
	}
}
