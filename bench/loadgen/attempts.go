package main

// `hold --run-attempts`: each simulated node takes attempts over its control stream
// (docs/node-protocol.md, "Attempts over the stream") and runs each at once, as a command
// that exits 0 without a byte of output would run: `attempt_taken` "started", then its end
// (`attempt_done`) until the edge acks it, as the agent does (oz0_node/jobs/intake.py,
// manager.py). Nothing is forked, checked or waited for: the control plane is measured
// alone. An attempt sent again is never run twice: "runs" while its end is not acked,
// "ran" after. The grant, the secrets and the limits are not checked (nothing runs); no
// `attempt_alive` is sent (an end goes at once; the edge keeps a streamed attempt by the
// node's `last_seen`, which its heartbeats keep fresh), and no `job_output` (none made).

import (
	"encoding/json"
	"regexp"
	"sync"
	"sync/atomic"
	"time"
)

const (
	// The agent's: an end not acked within ackTimeout is sent again retryAfter later; an
	// ack that did not store it (`unavailable`), retryAfter after it.
	ackTimeout = 10 * time.Second
	retryAfter = 1 * time.Second
	// What the agent runs at once when not told otherwise (oz0_node/identity.py).
	defaultMaxJobs = 4
	// What this simulated node says it applied (oz0/jobs/limits.py's shape).
	simulatedUser     = "oz0-loadgen"
	simulatedTracking = "none (a simulated node)"
	notApplied        = "not applied: a simulated node runs nothing"
)

var jobIDPattern = regexp.MustCompile(`^job-[0-9a-f]{12}$`)

// attemptCounters are shared by every node, for the stats line's `attempts`.
type attemptCounters struct {
	received    atomic.Int64 // `attempt` messages, repeats too
	malformed   atomic.Int64 // ignored, as the agent ignores them
	started     atomic.Int64 // answered "started": each attempt once
	runs        atomic.Int64 // sent again before its end was acked
	ran         atomic.Int64 // sent again after
	doneSent    atomic.Int64 // `attempt_done`, first sends
	doneResent  atomic.Int64 // and sends again (no ack in time, or `unavailable`)
	sendErrors  atomic.Int64 // sends that failed (the stream went; sent again later)
	stored      atomic.Int64 // acked `stored`
	ended       atomic.Int64 // acked `ended` (the cluster moved on: dropped, as the agent does)
	unavailable atomic.Int64 // acked `unavailable`: sent again
	pending     atomic.Int64 // started, end not acked yet
}

func (c *attemptCounters) snapshot() map[string]int64 {
	return map[string]int64{
		"received":         c.received.Load(),
		"malformed":        c.malformed.Load(),
		"started":          c.started.Load(),
		"answered_runs":    c.runs.Load(),
		"answered_ran":     c.ran.Load(),
		"done_sent":        c.doneSent.Load(),
		"done_resent":      c.doneResent.Load(),
		"send_errors":      c.sendErrors.Load(),
		"done_stored":      c.stored.Load(),
		"done_ended":       c.ended.Load(),
		"done_unavailable": c.unavailable.Load(),
		"pending":          c.pending.Load(),
	}
}

type attemptKey struct {
	job    string
	number int
}

// ranAttempt is one attempt this node ran: its end, until acked.
type ranAttempt struct {
	done  []byte // the attempt_done message; nil once acked
	timer *time.Timer
}

// nodeAttempts is one simulated node's attempts, across its streams (as the agent's
// manager outlives a stream): the stream there is now (send) carries the answers.
type nodeAttempts struct {
	k  *attemptCounters
	mu sync.Mutex
	// The current stream's send; nil between streams.
	send func([]byte) error
	// Every attempt this node ran; an acked one stays (its `ran`, as the agent's record).
	known map[attemptKey]*ranAttempt
	// The agent's waits; shorter in tests.
	ackTimeout, retryAfter time.Duration
}

func newNodeAttempts(k *attemptCounters) *nodeAttempts {
	return &nodeAttempts{
		k: k, known: map[attemptKey]*ranAttempt{}, ackTimeout: ackTimeout, retryAfter: retryAfter,
	}
}

// attach makes SEND the stream's: the ends not acked go on it when their timers fire.
func (a *nodeAttempts) attach(send func([]byte) error) {
	a.mu.Lock()
	a.send = send
	a.mu.Unlock()
}

func (a *nodeAttempts) detach() {
	a.mu.Lock()
	a.send = nil
	a.mu.Unlock()
}

// maxJobsMessage is what the agent sends once welcomed, when it takes attempts over the stream
// (oz0_node/control.py).
func maxJobsMessage(maxJobs int) []byte {
	raw, _ := json.Marshal(map[string]any{"type": "max_jobs", "max_jobs": maxJobs, "attempts": "stream"})
	return raw
}

// sentAttempt is what an `attempt` says, as far as a node that runs nothing needs it.
type sentAttempt struct {
	Attempt *struct {
		JobID  string                     `json:"job_id"`
		Number int64                      `json:"attempt"`
		Limits map[string]json.RawMessage `json:"limits"`
	} `json:"attempt"`
}

// received answers one `attempt` (RAW) on SEND, the stream it came on.
func (a *nodeAttempts) received(raw []byte, send func([]byte) error) {
	a.k.received.Add(1)
	var m sentAttempt
	if json.Unmarshal(raw, &m) != nil || m.Attempt == nil ||
		!jobIDPattern.MatchString(m.Attempt.JobID) || m.Attempt.Number < 1 || m.Attempt.Number >= 1<<31 {
		a.k.malformed.Add(1) // the agent logs it and answers nothing
		return
	}
	key := attemptKey{m.Attempt.JobID, int(m.Attempt.Number)}
	a.mu.Lock()
	st, seen := a.known[key]
	var done []byte
	taken := "started"
	switch {
	case seen && st.done != nil:
		taken = "runs"
		a.k.runs.Add(1)
	case seen:
		taken = "ran"
		a.k.ran.Add(1)
	default:
		// Run, and ended: its end goes at once, then again by the agent's timers until
		// acked (armed before the send: an ack cannot come before there is one to stop).
		done = doneMessage(key, m.Attempt.Limits)
		st = &ranAttempt{done: done}
		st.timer = time.AfterFunc(a.ackTimeout+a.retryAfter, func() { a.resend(key) })
		a.known[key] = st
		a.k.started.Add(1)
		a.k.pending.Add(1)
	}
	a.mu.Unlock()
	a.trySend(send, takenMessage(key, taken))
	if done != nil {
		a.k.doneSent.Add(1)
		a.trySend(send, done)
	}
}

// resend sends KEY's end again on the stream there is now, unless it was acked meanwhile.
func (a *nodeAttempts) resend(key attemptKey) {
	a.mu.Lock()
	st := a.known[key]
	if st == nil || st.done == nil {
		a.mu.Unlock()
		return
	}
	send, done := a.send, st.done
	if send == nil {
		// No stream: the agent waits for one, looking again every retryAfter.
		st.timer.Reset(a.retryAfter)
		a.mu.Unlock()
		return
	}
	st.timer.Reset(a.ackTimeout + a.retryAfter)
	a.mu.Unlock()
	a.k.doneResent.Add(1)
	a.trySend(send, done)
}

// doneAck is the edge's `attempt_done_ack`.
type doneAck struct {
	Job    string  `json:"job"`
	Number int     `json:"attempt"`
	Stored bool    `json:"stored"`
	Reason *string `json:"reason"`
}

// acked takes one `attempt_done_ack` (RAW): stored or ended, the end is done with;
// otherwise it goes again retryAfter later.
func (a *nodeAttempts) acked(raw []byte) {
	var m doneAck
	if json.Unmarshal(raw, &m) != nil {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	st := a.known[attemptKey{m.Job, m.Number}]
	if st == nil || st.done == nil {
		return // late or repeated: nobody waits for it, as on the agent
	}
	switch {
	case m.Stored:
		a.k.stored.Add(1)
	case m.Reason != nil && *m.Reason == "ended":
		a.k.ended.Add(1)
	default:
		a.k.unavailable.Add(1)
		st.timer.Reset(a.retryAfter)
		return
	}
	st.done = nil
	st.timer.Stop()
	a.k.pending.Add(-1)
}

func (a *nodeAttempts) trySend(send func([]byte) error, raw []byte) {
	if send == nil || send(raw) != nil {
		// The stream is going: its reader sees so. An unanswered attempt is sent again by
		// the edge, an end not acked by the timer.
		a.k.sendErrors.Add(1)
	}
}

func takenMessage(key attemptKey, taken string) []byte {
	raw, _ := json.Marshal(map[string]any{
		"type": "attempt_taken", "job": key.job, "attempt": key.number, "taken": taken,
	})
	return raw
}

// doneMessage is the end of an attempt of a command that exited 0 and printed nothing, as
// the agent's manager reports it (manager.py `_outcome`: the supervisor's status without
// its pid, and output_complete); each limit asked is told as not applied.
func doneMessage(key attemptKey, limits map[string]json.RawMessage) []byte {
	how := map[string]string{}
	for name, value := range limits {
		if string(value) != "null" {
			how[name] = notApplied
		}
	}
	raw, _ := json.Marshal(map[string]any{
		"type":    "attempt_done",
		"job":     key.job,
		"attempt": key.number,
		"result": map[string]any{
			"exit_code":     0,
			"signal":        nil,
			"ended_because": "exit",
			"output_bytes":  0,
			"truncated":     false,
			"applied": map[string]any{
				"user": simulatedUser, "tracking": simulatedTracking, "limits": how,
			},
			"output_complete": true,
		},
	})
	return raw
}
