package main

import (
	"context"
	"sync"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/workflowservice/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

// stickyGone keeps the sticky queues of workers that shut down from coming back.
//
// A worker calls ShutdownWorker, naming its sticky queue, as its shutdown begins (sdk-core
// spawns the call before its pollers have stopped), and matching unloads that queue. A poll
// of the worker's that reaches matching after the unload (one still on its way, cancelled by
// the worker but not yet seen so by the server) loads the queue again and counts as a live
// poller for 10 s: every next workflow task of that worker's workflows goes there and waits
// out the sticky schedule-to-start timeout (10 s) instead of going at once to another
// server's worker (a draining server's job workers: tests/test_graceful_stop.py). So, for a
// minute after a ShutdownWorker:
//   - a workflow task poll on that sticky queue is answered at once with no task, and never
//     reaches matching (sticky queue names are unique to a worker instance: it is no one
//     else's);
//   - a second after it, the ShutdownWorker is made again (without the worker's heartbeat),
//     which unloads the queue once more, whatever a poll past this point in the meantime
//     loaded.
//
// Temporal's own answer, frontend.enableCancelWorkerPollsOnShutdown, also tells SDKs that the
// server completes their polls at shutdown, and sdk-core then waits for that: a worker whose
// ShutdownWorker is refused (a node's, for a queue not its own) never finished shutting down
// (tests/test_temporal_privilege.py).
type stickyGone struct {
	mu    sync.Mutex
	until map[string]time.Time // sticky queue -> when it is forgotten
	now   func() time.Time
	after func(time.Duration, func()) // time.AfterFunc, or a test's
	again time.Duration               // the second ShutdownWorker's delay
	keep  time.Duration               // how long a queue is remembered
}

func newStickyGone() *stickyGone {
	return &stickyGone{
		until: map[string]time.Time{},
		now:   time.Now,
		after: func(d time.Duration, f func()) { time.AfterFunc(d, f) },
		again: time.Second,
		keep:  time.Minute,
	}
}

// againWithin bounds the second ShutdownWorker call.
const againWithin = 5 * time.Second

func (s *stickyGone) interceptor(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	switch r := req.(type) {
	case *workflowservice.PollWorkflowTaskQueueRequest:
		tq := r.GetTaskQueue()
		if tq.GetKind() == enumspb.TASK_QUEUE_KIND_STICKY && s.gone(tq.GetName()) {
			return &workflowservice.PollWorkflowTaskQueueResponse{}, nil
		}
	case *workflowservice.ShutdownWorkerRequest:
		resp, err := handler(ctx, req)
		if err == nil && r.GetStickyTaskQueue() != "" {
			s.remember(r.GetStickyTaskQueue())
			again, _ := proto.Clone(r).(*workflowservice.ShutdownWorkerRequest)
			again.WorkerHeartbeat = nil
			// The call's context ends with it; its values (the caller's claims) are kept.
			detached := context.WithoutCancel(ctx)
			s.after(s.again, func() {
				c, cancel := context.WithTimeout(detached, againWithin)
				defer cancel()
				_, _ = handler(c, again)
			})
		}
		return resp, err
	}
	return handler(ctx, req)
}

func (s *stickyGone) remember(queue string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	for name, until := range s.until {
		if !now.Before(until) {
			delete(s.until, name)
		}
	}
	s.until[queue] = now.Add(s.keep)
}

func (s *stickyGone) gone(queue string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	until, ok := s.until[queue]
	return ok && s.now().Before(until)
}
