package main

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"go.temporal.io/api/serviceerror"
	taskqueuepb "go.temporal.io/api/taskqueue/v1"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/server/common/authorization"
	"go.temporal.io/server/common/log"
	"go.temporal.io/server/common/log/tag"
)

// A node may heartbeat and answer only the tasks its own polls were given, through this host.

type nodeCall struct {
	t     *testing.T
	pki   *testPKI
	table *authz
	z     authorizer
}

func newNodeCall(t *testing.T) *nodeCall {
	table := newAuthz(keyed(map[string]*NodeEntry{
		"node-a": {Tenant: "acme", State: "accepted"},
		"node-b": {Tenant: "acme", State: "accepted"},
	}))
	return &nodeCall{t: t, pki: newTestPKI(t), table: table, z: authorizer{a: table}}
}

// poll runs an activity poll by NODE through the interceptor, answered with TOKEN.
func (n *nodeCall) poll(node string, token []byte, err error) {
	n.t.Helper()
	req := &workflowservice.PollActivityTaskQueueRequest{Namespace: "acme", TaskQueue: &taskqueuepb.TaskQueue{Name: node}}
	ctx := n.pki.peerCtx(n.t, context.Background(), n.pki.role(n.t, "node", node))
	_, got := n.table.interceptor(ctx, req, pollInfo, func(context.Context, any) (any, error) {
		return &workflowservice.PollActivityTaskQueueResponse{TaskToken: token}, err
	})
	if !errors.Is(got, err) {
		n.t.Fatalf("poll returned %v, want %v", got, err)
	}
}

// call runs REQ by NODE through the interceptor; the handler returns ERR.
func (n *nodeCall) call(node string, req any, err error) {
	n.t.Helper()
	ctx := n.pki.peerCtx(n.t, context.Background(), n.pki.role(n.t, "node", node))
	_, _ = n.table.interceptor(ctx, req, pollInfo, func(context.Context, any) (any, error) { return nil, err })
}

func (n *nodeCall) decide(node, apiName string, req any) authorization.Decision {
	n.t.Helper()
	return authorizeRequest(n.t, n.z, n.pki.claims(n.t, n.pki.role(n.t, "node", node)), apiName, "acme", req).Decision
}

func heartbeat(token []byte) *workflowservice.RecordActivityTaskHeartbeatRequest {
	return &workflowservice.RecordActivityTaskHeartbeatRequest{Namespace: "acme", TaskToken: token}
}

func TestATaskTokenBelongsToTheNodeWhosePollGotIt(t *testing.T) {
	n := newNodeCall(t)
	token := []byte("task-1")
	if n.decide("node-a", apiHeartbeat, heartbeat(token)) != authorization.DecisionDeny {
		t.Fatal("heartbeat allowed before any poll handed the token out")
	}
	n.poll("node-a", token, nil)
	for _, tc := range []struct {
		api string
		req any
	}{
		{apiHeartbeat, heartbeat(token)},
		{apiCompleted, &workflowservice.RespondActivityTaskCompletedRequest{Namespace: "acme", TaskToken: token}},
		{apiFailed, &workflowservice.RespondActivityTaskFailedRequest{Namespace: "acme", TaskToken: token}},
		{apiCanceled, &workflowservice.RespondActivityTaskCanceledRequest{Namespace: "acme", TaskToken: token}},
	} {
		if d := n.decide("node-a", tc.api, tc.req); d != authorization.DecisionAllow {
			t.Errorf("node-a %s with its own token: %s", tc.api, decisionName(d))
		}
		if d := n.decide("node-b", tc.api, tc.req); d != authorization.DecisionDeny {
			t.Errorf("node-b %s with node-a's token: %s", tc.api, decisionName(d))
		}
	}
	// A failed or empty poll hands nothing out.
	n.poll("node-b", []byte("task-2"), errors.New("unavailable"))
	n.poll("node-b", nil, nil)
	if n.decide("node-b", apiHeartbeat, heartbeat([]byte("task-2"))) != authorization.DecisionDeny {
		t.Fatal("a failed poll's token was remembered")
	}
}

func TestATaskIsForgottenOnceAnsweredOrGone(t *testing.T) {
	cases := []struct {
		name   string
		req    func([]byte) any
		err    error
		forget bool
	}{
		{"completed", func(tok []byte) any {
			return &workflowservice.RespondActivityTaskCompletedRequest{Namespace: "acme", TaskToken: tok}
		}, nil, true},
		{"failed", func(tok []byte) any {
			return &workflowservice.RespondActivityTaskFailedRequest{Namespace: "acme", TaskToken: tok}
		}, nil, true},
		{"canceled", func(tok []byte) any {
			return &workflowservice.RespondActivityTaskCanceledRequest{Namespace: "acme", TaskToken: tok}
		}, nil, true},
		{"completed, but Temporal no longer knows it", func(tok []byte) any {
			return &workflowservice.RespondActivityTaskCompletedRequest{Namespace: "acme", TaskToken: tok}
		}, serviceerror.NewNotFound("gone"), true},
		{"completion failed: the worker may try again", func(tok []byte) any {
			return &workflowservice.RespondActivityTaskCompletedRequest{Namespace: "acme", TaskToken: tok}
		}, serviceerror.NewUnavailable("try again"), false},
		{"heartbeat", func(tok []byte) any { return heartbeat(tok) }, nil, false},
		{"heartbeat of a timed-out task", func(tok []byte) any { return heartbeat(tok) }, serviceerror.NewNotFound("gone"), true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			n := newNodeCall(t)
			token := []byte("task-" + tc.name)
			n.poll("node-a", token, nil)
			n.call("node-a", tc.req(token), tc.err)
			want := authorization.DecisionAllow
			if tc.forget {
				want = authorization.DecisionDeny
			}
			if d := n.decide("node-a", apiHeartbeat, heartbeat(token)); d != want {
				t.Fatalf("heartbeat afterwards: %s, want %s", decisionName(d), decisionName(want))
			}
		})
	}
}

func TestANodeLosingAccessLosesItsTasks(t *testing.T) {
	for _, change := range []map[string]*NodeEntry{
		{"node-a": {Tenant: "acme", State: "blocked"}},
		{"node-a": nil},
		{"node-a": {Tenant: "beta", State: "accepted"}},
	} {
		n := newNodeCall(t)
		n.poll("node-a", []byte("t1"), nil)
		n.poll("node-b", []byte("t2"), nil)
		n.table.update(keyed(change), false)
		n.table.update(keyed(map[string]*NodeEntry{"node-a": {Tenant: "acme", State: "accepted"}}), false)
		if n.decide("node-a", apiHeartbeat, heartbeat([]byte("t1"))) != authorization.DecisionDeny {
			t.Fatalf("after %v node-a still holds its old task", change)
		}
		if n.decide("node-b", apiHeartbeat, heartbeat([]byte("t2"))) != authorization.DecisionAllow {
			t.Fatalf("after %v node-b lost its task", change)
		}
	}
	// A table push that keeps the node's access keeps its tasks.
	n := newNodeCall(t)
	n.poll("node-a", []byte("t1"), nil)
	n.table.update(keyed(map[string]*NodeEntry{"node-a": {Tenant: "acme", State: "accepted"}}), true)
	if n.decide("node-a", apiHeartbeat, heartbeat([]byte("t1"))) != authorization.DecisionAllow {
		t.Fatal("an unchanged node lost its task in a replace")
	}
}

func TestTaskTokensAreBoundedOldestFirst(t *testing.T) {
	n := newNodeCall(t)
	for i := 0; i < maxTaskTokensPerNode+10; i++ {
		n.poll("node-a", []byte(fmt.Sprintf("t%d", i)), nil)
	}
	if got := n.table.tokens["node-a"].len(); got != maxTaskTokensPerNode {
		t.Fatalf("remembered %d tokens, want %d", got, maxTaskTokensPerNode)
	}
	if n.decide("node-a", apiHeartbeat, heartbeat([]byte("t0"))) != authorization.DecisionDeny {
		t.Fatal("the oldest token survived the bound")
	}
	last := []byte(fmt.Sprintf("t%d", maxTaskTokensPerNode+9))
	if n.decide("node-a", apiHeartbeat, heartbeat(last)) != authorization.DecisionAllow {
		t.Fatal("the newest token was dropped")
	}
	// Answering every task leaves nothing behind for the node.
	for i := 0; i < maxTaskTokensPerNode+10; i++ {
		n.call("node-a", &workflowservice.RespondActivityTaskCompletedRequest{Namespace: "acme", TaskToken: []byte(fmt.Sprintf("t%d", i))}, nil)
	}
	if _, kept := n.table.tokens["node-a"]; kept {
		t.Fatal("an empty token set was kept")
	}
}

func TestTaskTokensSet(t *testing.T) {
	s := newTaskTokens(2)
	s.add([]byte("a"))
	s.add([]byte("b"))
	s.add([]byte("a")) // refreshed: now the newest
	s.add([]byte("c"))
	if !s.has([]byte("a")) || s.has([]byte("b")) || !s.has([]byte("c")) || s.len() != 2 {
		t.Fatalf("set after eviction: a=%v b=%v c=%v len=%d", s.has([]byte("a")), s.has([]byte("b")), s.has([]byte("c")), s.len())
	}
	if s.has(nil) || (*taskTokens)(nil).has([]byte("a")) {
		t.Fatal("nil token or nil set matched")
	}
	s.remove([]byte("a"))
	s.remove([]byte("nothing"))
	if s.has([]byte("a")) || s.len() != 1 {
		t.Fatal("remove failed")
	}
}

// ---------------------------------------------------------------------------
// refused calls are logged, once per caller and API per interval

type countingLogger struct {
	log.Logger
	warns int
}

func (l *countingLogger) Warn(string, ...tag.Tag) { l.warns++ }

func TestDeniedCallsAreLoggedAtABoundedRate(t *testing.T) {
	logger := &countingLogger{Logger: log.NewNoopLogger()}
	d := newDeniedLog(logger)
	now := time.Unix(1000, 0)
	d.now = func() time.Time { return now }
	target := &authorization.CallTarget{APIName: apiStartWorkflow, Namespace: "acme"}
	if !d.record("node:n1", target, "API not allowed for nodes") {
		t.Fatal("first refusal not logged")
	}
	for i := 0; i < 100; i++ {
		if d.record("node:n1", target, "API not allowed for nodes") {
			t.Fatal("a repeated refusal was logged again within the interval")
		}
	}
	if !d.record("node:n2", target, "x") || !d.record("node:n1", &authorization.CallTarget{APIName: apiListNS}, "x") {
		t.Fatal("another caller or API was not logged")
	}
	if !d.record("node:n1", target, "unknown node") {
		t.Fatal("another reason was not logged")
	}
	now = now.Add(deniedLogEvery)
	if !d.record("node:n1", target, "API not allowed for nodes") {
		t.Fatal("not logged again after the interval")
	}
	if logger.warns != 5 {
		t.Fatalf("logged %d lines, want 5", logger.warns)
	}
	for i := 0; i < deniedLogKeys+5; i++ {
		d.record(fmt.Sprintf("node:%d", i), target, "x")
	}
	if len(d.last) > deniedLogKeys {
		t.Fatalf("remembered %d callers, bound %d", len(d.last), deniedLogKeys)
	}
	var none *deniedLog
	if none.record("node:n1", target, "x") {
		t.Fatal("a nil log logged")
	}
}

func TestAuthorizerLogsWhatItRefuses(t *testing.T) {
	logger := &countingLogger{Logger: log.NewNoopLogger()}
	pki := newTestPKI(t)
	z := newAuthorizer(newAuthz(keyed(map[string]*NodeEntry{"n1": {Tenant: "acme", State: "accepted"}})), logger)
	c := pki.claims(t, pki.role(t, "node", "n1"))
	authorize(t, z, c, apiDescribeNS, "acme")
	if logger.warns != 0 {
		t.Fatal("an allowed call was logged")
	}
	authorize(t, z, c, apiStartWorkflow, "acme")
	if logger.warns != 1 {
		t.Fatalf("a refused call logged %d lines, want 1", logger.warns)
	}
}
