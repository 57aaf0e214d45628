package main

import (
	"errors"

	"go.temporal.io/api/serviceerror"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/server/common/api"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// What a node may call: exactly what an activity worker on its own task queue needs, and
// nothing else (an allowlist: a call not named here is refused). Each check sees the
// request, after the namespace was found to be the node's own; it returns why the call is
// refused, or "". docs/node-protocol.md lists the same calls.
//
// The task queue of a node is its node ID. Temporal's task tokens are not signed and do not
// name the queue, so a node may heartbeat or answer only a token that one of its own polls
// returned through this host (remembered per node, bounded by maxTaskTokensPerNode).
var nodeAPIs = map[string]func(a *authz, node string, req any) string{
	// The SDK checks the namespace when its worker starts.
	api.WorkflowServicePrefix + "DescribeNamespace": func(_ *authz, _ string, req any) string {
		r, ok := req.(*workflowservice.DescribeNamespaceRequest)
		if !ok {
			return "unexpected request"
		}
		if r.GetId() != "" {
			return "namespace must be named, not given by ID"
		}
		return ""
	},
	api.WorkflowServicePrefix + "PollActivityTaskQueue": func(_ *authz, node string, req any) string {
		r, ok := req.(*workflowservice.PollActivityTaskQueueRequest)
		if !ok {
			return "unexpected request"
		}
		if r.GetTaskQueue().GetName() != node {
			return "a node polls only its own task queue"
		}
		return ""
	},
	api.WorkflowServicePrefix + "RecordActivityTaskHeartbeat":  ownTask,
	api.WorkflowServicePrefix + "RespondActivityTaskCompleted": ownTask,
	api.WorkflowServicePrefix + "RespondActivityTaskFailed":    ownTask,
	api.WorkflowServicePrefix + "RespondActivityTaskCanceled":  ownTask,
	// The SDK reports its worker's state now and then (what Temporal shows of workers).
	api.WorkflowServicePrefix + "RecordWorkerHeartbeat": func(_ *authz, node string, req any) string {
		r, ok := req.(*workflowservice.RecordWorkerHeartbeatRequest)
		if !ok {
			return "unexpected request"
		}
		for _, hb := range r.GetWorkerHeartbeat() {
			if hb.GetTaskQueue() != node {
				return "a node reports only its own worker"
			}
		}
		return ""
	},
	// The SDK tells the server its worker stops, so the server ends the worker's polls.
	api.WorkflowServicePrefix + "ShutdownWorker": func(_ *authz, node string, req any) string {
		r, ok := req.(*workflowservice.ShutdownWorkerRequest)
		if !ok {
			return "unexpected request"
		}
		if q := r.GetTaskQueue(); q != "" && q != node {
			return "a node stops only its own worker"
		}
		// A sticky queue is a workflow worker's; a node has none to unload.
		if r.GetStickyTaskQueue() != "" {
			return "a node has no sticky task queue"
		}
		if q := r.GetWorkerHeartbeat().GetTaskQueue(); q != "" && q != node {
			return "a node stops only its own worker"
		}
		return ""
	},
}

type taskTokenRequest interface{ GetTaskToken() []byte }

func ownTask(a *authz, node string, req any) string {
	r, ok := req.(taskTokenRequest)
	if !ok {
		return "unexpected request"
	}
	if !a.nodeHoldsToken(node, r.GetTaskToken()) {
		return "not a task this node was given"
	}
	return ""
}

// noteTaskTokens remembers the task a poll handed to the node WHO, and forgets a task once
// it was answered or Temporal no longer knows it.
func (a *authz) noteTaskTokens(who caller, req, resp any, err error) {
	node := who.name
	switch r := req.(type) {
	case *workflowservice.PollActivityTaskQueueRequest:
		p, ok := resp.(*workflowservice.PollActivityTaskQueueResponse)
		if err != nil || !ok || len(p.GetTaskToken()) == 0 {
			return
		}
		a.mu.Lock()
		defer a.mu.Unlock()
		// A node that lost access meanwhile, or a certificate renewed away meanwhile, keeps
		// nothing (its poll was cancelled anyway).
		if e := a.nodes[node]; !e.heldBy(who.cert) || !e.allows(r.GetNamespace()) {
			return
		}
		if a.tokens[node] == nil {
			a.tokens[node] = newTaskTokens(maxTaskTokensPerNode)
		}
		a.tokens[node].add(p.GetTaskToken())
	case *workflowservice.RespondActivityTaskCompletedRequest,
		*workflowservice.RespondActivityTaskFailedRequest,
		*workflowservice.RespondActivityTaskCanceledRequest:
		if err == nil || isNotFound(err) {
			a.forgetTaskToken(node, r.(taskTokenRequest).GetTaskToken())
		}
	case *workflowservice.RecordActivityTaskHeartbeatRequest:
		if isNotFound(err) {
			a.forgetTaskToken(node, r.GetTaskToken())
		}
	}
}

func (a *authz) forgetTaskToken(node string, token []byte) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if t := a.tokens[node]; t != nil {
		t.remove(token)
		if t.len() == 0 {
			delete(a.tokens, node)
		}
	}
}

// isNotFound: Temporal no longer knows the task (it timed out, or was answered already).
func isNotFound(err error) bool {
	var nf *serviceerror.NotFound
	return errors.As(err, &nf) || status.Code(err) == codes.NotFound
}
