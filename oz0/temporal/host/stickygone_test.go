package main

import (
	"context"
	"testing"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	taskqueuepb "go.temporal.io/api/taskqueue/v1"
	workerpb "go.temporal.io/api/worker/v1"
	"go.temporal.io/api/workflowservice/v1"
)

// A stickyGone on a clock of the test's, whose delayed calls the test runs.
type stickyClock struct {
	s       *stickyGone
	now     time.Time
	pending []func()
	calls   []any // what reached the handler
}

func newStickyClock() *stickyClock {
	c := &stickyClock{now: time.Unix(1_800_000_000, 0)}
	c.s = newStickyGone()
	c.s.now = func() time.Time { return c.now }
	c.s.after = func(d time.Duration, f func()) {
		if d != time.Second {
			panic("the second ShutdownWorker is made a second after the first")
		}
		c.pending = append(c.pending, f)
	}
	return c
}

func (c *stickyClock) call(req any) any {
	resp, err := c.s.interceptor(context.Background(), req, nil, func(_ context.Context, r any) (any, error) {
		c.calls = append(c.calls, r)
		return "handled", nil
	})
	if err != nil {
		panic(err)
	}
	return resp
}

func stickyPoll(name string) *workflowservice.PollWorkflowTaskQueueRequest {
	return &workflowservice.PollWorkflowTaskQueueRequest{
		Namespace: "default",
		TaskQueue: &taskqueuepb.TaskQueue{Name: name, Kind: enumspb.TASK_QUEUE_KIND_STICKY, NormalName: "oz0-jobs"},
	}
}

func TestAPollOnTheStickyQueueOfAWorkerThatShutDownNeverReachesMatching(t *testing.T) {
	c := newStickyClock()
	if c.call(stickyPoll("server-a-1")) != "handled" {
		t.Fatal("a live worker's sticky poll is passed on")
	}
	c.call(&workflowservice.ShutdownWorkerRequest{Namespace: "default", StickyTaskQueue: "server-a-1"})
	c.calls = nil
	resp, empty := c.call(stickyPoll("server-a-1")).(*workflowservice.PollWorkflowTaskQueueResponse)
	if !empty || resp.GetTaskToken() != nil || len(c.calls) != 0 {
		t.Fatalf("answered %v, passed on %v: want an empty answer, nothing passed on", resp, c.calls)
	}
	// Another worker's sticky queue, and the normal queue, are polled as before.
	normal := &workflowservice.PollWorkflowTaskQueueRequest{TaskQueue: &taskqueuepb.TaskQueue{Name: "server-a-1"}}
	if c.call(stickyPoll("server-b-1")) != "handled" || c.call(normal) != "handled" {
		t.Fatal("only the shut-down worker's sticky queue is answered here")
	}
	// Forgotten after a minute.
	c.now = c.now.Add(time.Minute)
	if c.call(stickyPoll("server-a-1")) != "handled" {
		t.Fatal("remembered for a minute only")
	}
}

func TestAShutdownWorkerIsMadeAgainASecondLaterWithoutItsHeartbeat(t *testing.T) {
	c := newStickyClock()
	first := &workflowservice.ShutdownWorkerRequest{
		Namespace: "default", StickyTaskQueue: "server-a-1", WorkerInstanceKey: "k",
		WorkerHeartbeat: &workerpb.WorkerHeartbeat{WorkerInstanceKey: "k"},
	}
	c.call(first)
	if len(c.calls) != 1 || len(c.pending) != 1 {
		t.Fatalf("calls %d, pending %d: want the call now and one later", len(c.calls), len(c.pending))
	}
	c.pending[0]()
	again, ok := c.calls[1].(*workflowservice.ShutdownWorkerRequest)
	if !ok || again.GetStickyTaskQueue() != "server-a-1" || again.GetWorkerInstanceKey() != "k" || again.WorkerHeartbeat != nil {
		t.Fatalf("made again as %v", c.calls[1])
	}
	if first.WorkerHeartbeat == nil {
		t.Fatal("the caller's request is not changed")
	}
	// A worker with no sticky queue (a node's) has nothing to make again.
	c.call(&workflowservice.ShutdownWorkerRequest{Namespace: "default", TaskQueue: "node-1"})
	if len(c.pending) != 1 {
		t.Fatal("no second call for a worker without a sticky queue")
	}
}
