package main

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"go.temporal.io/server/common/authorization"
)

// The operator-serial logic: only the certificate whose serial the parent pushed is admin.

func TestOnlyTheOperatorsCurrentCertificateIsAdmin(t *testing.T) {
	pki := newTestPKI(t)
	table := newAuthz(nil)
	z := authorizer{a: table}
	first, renewed := pki.role(t, "operator", "alice"), pki.role(t, "operator", "alice")
	c1, c2 := pki.claims(t, first), pki.claims(t, renewed)
	expect := func(step string, c *authorization.Claims, want authorization.Decision) {
		t.Helper()
		if r := authorize(t, z, c, apiListNS, ""); r.Decision != want {
			t.Fatalf("%s: %s (%q), want %s", step, decisionName(r.Decision), r.Reason, decisionName(want))
		}
	}
	expect("no operators pushed yet", c1, authorization.DecisionDeny)
	table.setOperators(map[string]string{"alice": first.SerialNumber.String()})
	expect("first certificate current", c1, authorization.DecisionAllow)
	expect("renewed certificate not yet current", c2, authorization.DecisionDeny)
	table.setOperators(map[string]string{"alice": renewed.SerialNumber.String()})
	expect("after renewal, the old one", c1, authorization.DecisionDeny)
	expect("after renewal, the new one", c2, authorization.DecisionAllow)
	// Another operator's serial never makes alice admin.
	table.setOperators(map[string]string{"bob": renewed.SerialNumber.String()})
	expect("serial pushed for another name", c2, authorization.DecisionDeny)
	table.setOperators(map[string]string{})
	expect("operator removed", c2, authorization.DecisionDeny)
	if table.operatorCount() != 0 {
		t.Fatalf("operatorCount = %d, want 0", table.operatorCount())
	}
}

func TestSetOperatorsCopiesTheTable(t *testing.T) {
	pki := newTestPKI(t)
	cert := pki.role(t, "operator", "alice")
	pushed := map[string]string{"alice": cert.SerialNumber.String()}
	table := newAuthz(nil)
	table.setOperators(pushed)
	pushed["alice"] = "1"
	if r := authorize(t, authorizer{a: table}, pki.claims(t, cert), apiListNS, ""); r.Decision != authorization.DecisionAllow {
		t.Fatalf("the caller's map is aliased by the table: %q", r.Reason)
	}
}

func TestRenewalCancelsCallsOfTheOldCertificateOnly(t *testing.T) {
	pki := newTestPKI(t)
	oldCert, newCert, bobCert := pki.role(t, "operator", "alice"), pki.role(t, "operator", "alice"), pki.role(t, "operator", "bob")
	table := newAuthz(nil)
	table.setOperators(map[string]string{"alice": oldCert.SerialNumber.String(), "bob": bobCert.SerialNumber.String()})
	old := startCall(t, table, pki.peerCtx(t, context.Background(), oldCert))
	bob := startCall(t, table, pki.peerCtx(t, context.Background(), bobCert))
	if got := trackedCalls(table); got != 2 {
		t.Fatalf("tracked calls = %d, want 2", got)
	}
	if n := table.setOperators(map[string]string{"alice": newCert.SerialNumber.String(), "bob": bobCert.SerialNumber.String()}); n != 1 {
		t.Fatalf("renewal cancelled %d calls, want 1", n)
	}
	old.expectCancelled(t)
	bob.expectLive(t)
	renewed := startCall(t, table, pki.peerCtx(t, context.Background(), newCert))
	if n := table.setOperators(map[string]string{"alice": newCert.SerialNumber.String()}); n != 0 {
		t.Fatalf("pushing the same serial again cancelled %d calls", n)
	}
	renewed.expectLive(t)
}

// A renewal landing after Temporal's authorizer allowed a call, before it is tracked.
func TestInterceptorRefusesAnOperatorCallAfterARenewal(t *testing.T) {
	pki := newTestPKI(t)
	oldCert, newCert := pki.role(t, "operator", "alice"), pki.role(t, "operator", "alice")
	table := newAuthz(nil)
	table.setOperators(map[string]string{"alice": newCert.SerialNumber.String()})
	ran := false
	_, err := table.interceptor(pki.peerCtx(t, context.Background(), oldCert), "req", pollInfo, func(context.Context, any) (any, error) {
		ran = true
		return nil, nil
	})
	if err == nil || ran {
		t.Fatalf("old certificate's call ran (err %v)", err)
	}
	resp, err := table.interceptor(pki.peerCtx(t, context.Background(), newCert), "req", pollInfo, func(context.Context, any) (any, error) {
		return "ran", nil
	})
	if err != nil || resp != "ran" {
		t.Fatalf("current certificate: (%v, %v), want (ran, nil)", resp, err)
	}
}

func TestHandleOperatorsCommand(t *testing.T) {
	f := captureProtocol(t)
	pki := newTestPKI(t)
	table := newAuthz(nil)
	stopCh := make(chan string, 1)
	cert := pki.role(t, "operator", "alice")
	handleCommand([]byte(`{"id":7,"op":"operators","operators":{"alice":"`+cert.SerialNumber.String()+`"}}`), table, nil, stopCh)
	if !table.operatorCurrent(operatorCert{name: "alice", serial: cert.SerialNumber.String()}) {
		t.Fatal("operators command did not take effect")
	}
	// A command without its table is refused, not taken as "no operators".
	handleCommand([]byte(`{"id":8,"op":"operators"}`), table, nil, stopCh)
	if !table.operatorCurrent(operatorCert{name: "alice", serial: cert.SerialNumber.String()}) {
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
	c, err := parseConfig([]byte(`{"advertise":"127.0.0.1","operators":{"alice":"42"}}`))
	if err != nil {
		t.Fatal(err)
	}
	if c.Operators["alice"] != "42" {
		t.Fatalf("operators = %v", c.Operators)
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
