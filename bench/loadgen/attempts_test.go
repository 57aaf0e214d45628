package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"testing"
	"time"
)

// wire records what a simulated node sends on one stream, parsed.
type wire struct {
	mu   sync.Mutex
	sent []map[string]any
	more chan struct{}
	fail bool
}

func newWire() *wire { return &wire{more: make(chan struct{}, 100)} }

func (w *wire) send(raw []byte) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.fail {
		return errors.New("stream gone")
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		panic(err)
	}
	w.sent = append(w.sent, m)
	w.more <- struct{}{}
	return nil
}

func (w *wire) messages() []map[string]any {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]map[string]any(nil), w.sent...)
}

// waitFor waits until COUNT messages were sent, at most WITHIN.
func (w *wire) waitFor(t *testing.T, count int, within time.Duration) []map[string]any {
	t.Helper()
	deadline := time.After(within)
	for len(w.messages()) < count {
		select {
		case <-w.more:
		case <-deadline:
			t.Fatalf("%d messages sent within %v, want %d: %v", len(w.messages()), within, count, w.messages())
		}
	}
	return w.messages()
}

func attemptMessage(job string, number int, limits string) []byte {
	extra := ""
	if limits != "" {
		extra = `, "limits": ` + limits
	}
	return fmt.Appendf(nil, `{"type": "attempt", "lost_after": 15.0, "attempt": {"job_id": %q,`+
		` "attempt": %d, "command": ["true"], "env": {}, "timeout": null,`+
		` "grant": {"payload": "cA==", "signature": "cw=="}%s}}`, job, number, extra)
}

func ackMessage(job string, number int, stored bool, reason string) []byte {
	r := "null"
	if reason != "" {
		r = fmt.Sprintf("%q", reason)
	}
	return fmt.Appendf(nil, `{"type": "attempt_done_ack", "job": %q, "attempt": %d, "stored": %t, "reason": %s}`,
		job, number, stored, r)
}

const job1 = "job-0123456789ab"

func fast(k *attemptCounters) *nodeAttempts {
	a := newNodeAttempts(k)
	a.ackTimeout, a.retryAfter = 300*time.Millisecond, 50*time.Millisecond
	return a
}

func TestAnAttemptIsStartedAndEndsExitZeroAtOnce(t *testing.T) {
	k := &attemptCounters{}
	a := newNodeAttempts(k)
	w := newWire()
	a.attach(w.send)
	a.received(attemptMessage(job1, 1, ""), w.send)
	sent := w.messages()
	if len(sent) != 2 {
		t.Fatalf("sent %v, want attempt_taken then attempt_done", sent)
	}
	taken := map[string]any{"type": "attempt_taken", "job": job1, "attempt": 1.0, "taken": "started"}
	if !reflect.DeepEqual(sent[0], taken) {
		t.Fatalf("answer %v, want %v", sent[0], taken)
	}
	// As manager.py `_outcome` reports a command that exited 0 and printed nothing (the
	// supervisor's status without its pid, and output_complete).
	done := map[string]any{
		"type": "attempt_done", "job": job1, "attempt": 1.0,
		"result": map[string]any{
			"exit_code": 0.0, "signal": nil, "ended_because": "exit", "output_bytes": 0.0,
			"truncated": false, "output_complete": true,
			"applied": map[string]any{
				"user": simulatedUser, "tracking": simulatedTracking, "limits": map[string]any{},
			},
		},
	}
	if !reflect.DeepEqual(sent[1], done) {
		t.Fatalf("end %v, want %v", sent[1], done)
	}
	if s := k.snapshot(); s["received"] != 1 || s["started"] != 1 || s["done_sent"] != 1 || s["pending"] != 1 {
		t.Fatalf("counters %v", s)
	}
	a.acked(ackMessage(job1, 1, true, ""))
	if s := k.snapshot(); s["done_stored"] != 1 || s["pending"] != 0 {
		t.Fatalf("counters after the ack %v", s)
	}
}

func TestAnAttemptSentAgainIsNeverRunTwice(t *testing.T) {
	k := &attemptCounters{}
	a := newNodeAttempts(k)
	w := newWire()
	a.attach(w.send)
	a.received(attemptMessage(job1, 2, ""), w.send)
	// Sent again before its end was acked (its answer lost, a new stream): it runs here.
	a.received(attemptMessage(job1, 2, ""), w.send)
	a.acked(ackMessage(job1, 2, true, ""))
	// And after: it ran here, and is not run again.
	a.received(attemptMessage(job1, 2, ""), w.send)
	var kinds []string
	for _, m := range w.messages() {
		kind := m["type"].(string)
		if kind == "attempt_taken" {
			kind += ":" + m["taken"].(string)
		}
		kinds = append(kinds, kind)
	}
	want := []string{"attempt_taken:started", "attempt_done", "attempt_taken:runs", "attempt_taken:ran"}
	if !reflect.DeepEqual(kinds, want) {
		t.Fatalf("sent %v, want %v", kinds, want)
	}
	s := k.snapshot()
	if s["received"] != 3 || s["started"] != 1 || s["answered_runs"] != 1 || s["answered_ran"] != 1 || s["done_sent"] != 1 {
		t.Fatalf("counters %v", s)
	}
	// Another attempt of the same job is another attempt.
	a.received(attemptMessage(job1, 3, ""), w.send)
	if s := k.snapshot(); s["started"] != 2 {
		t.Fatalf("attempt 3 not started: %v", s)
	}
}

func TestAnEndIsSentAgainUntilAcked(t *testing.T) {
	k := &attemptCounters{}
	a := fast(k)
	w := newWire()
	a.attach(w.send)
	a.received(attemptMessage(job1, 1, ""), w.send)
	// No ack within ackTimeout: sent again retryAfter later, and again.
	began := time.Now()
	sent := w.waitFor(t, 4, 2*time.Second)
	if took := time.Since(began); took < 2*(a.ackTimeout+a.retryAfter)-20*time.Millisecond {
		t.Fatalf("sent again twice within %v: sooner than the agent", took)
	}
	if !reflect.DeepEqual(sent[2], sent[1]) || !reflect.DeepEqual(sent[3], sent[1]) {
		t.Fatalf("sent again %v, want %v", sent[2:], sent[1])
	}
	// `unavailable`: again retryAfter after the ack.
	a.acked(ackMessage(job1, 1, false, "unavailable"))
	w.waitFor(t, 5, a.retryAfter+100*time.Millisecond)
	// `ended`: the cluster has moved on; dropped, never sent again.
	a.acked(ackMessage(job1, 1, false, "ended"))
	time.Sleep(2 * (a.ackTimeout + a.retryAfter))
	if n := len(w.messages()); n != 5 {
		t.Fatalf("%d messages after the ack `ended`, want 5", n)
	}
	s := k.snapshot()
	if s["done_resent"] != 3 || s["done_unavailable"] != 1 || s["done_ended"] != 1 || s["pending"] != 0 {
		t.Fatalf("counters %v", s)
	}
	// Late or repeated acks change nothing.
	a.acked(ackMessage(job1, 1, true, ""))
	a.acked(ackMessage("job-ffffffffffff", 1, true, ""))
	if s := k.snapshot(); s["done_stored"] != 0 {
		t.Fatalf("a late ack counted: %v", s)
	}
}

func TestAnEndNotAckedGoesOnTheNextStream(t *testing.T) {
	k := &attemptCounters{}
	a := fast(k)
	first := newWire()
	a.attach(first.send)
	a.received(attemptMessage(job1, 1, ""), first.send)
	a.detach() // the stream ended before the ack
	time.Sleep(2 * (a.ackTimeout + a.retryAfter))
	if n := len(first.messages()); n != 2 {
		t.Fatalf("%d messages on the first stream, want 2", n)
	}
	second := newWire()
	a.attach(second.send)
	sent := second.waitFor(t, 1, 2*a.retryAfter+100*time.Millisecond)
	if sent[0]["type"] != "attempt_done" || sent[0]["job"] != job1 {
		t.Fatalf("on the next stream %v, want the end again", sent)
	}
	a.acked(ackMessage(job1, 1, true, ""))
	time.Sleep(2 * (a.ackTimeout + a.retryAfter))
	if n := len(second.messages()); n != 1 {
		t.Fatalf("%d messages after the ack, want 1", n)
	}
}

func TestASendThatFailsIsCountedAndTheEndStillGoesLater(t *testing.T) {
	k := &attemptCounters{}
	a := fast(k)
	w := newWire()
	w.fail = true
	a.attach(w.send)
	a.received(attemptMessage(job1, 1, ""), w.send)
	if s := k.snapshot(); s["send_errors"] != 2 || s["pending"] != 1 {
		t.Fatalf("counters %v", s)
	}
	w.mu.Lock()
	w.fail = false
	w.mu.Unlock()
	w.waitFor(t, 1, 2*(a.ackTimeout+a.retryAfter))
	if m := w.messages()[0]; m["type"] != "attempt_done" {
		t.Fatalf("sent %v, want the end again", m)
	}
}

func TestMalformedAttemptsAreIgnored(t *testing.T) {
	k := &attemptCounters{}
	a := newNodeAttempts(k)
	w := newWire()
	a.attach(w.send)
	for _, raw := range []string{
		`{"type": "attempt"}`,
		`{"type": "attempt", "attempt": {"job_id": "job-1", "attempt": 1}}`,
		`{"type": "attempt", "attempt": {"job_id": "job-0123456789ab", "attempt": 0}}`,
		`{"type": "attempt", "attempt": {"job_id": "job-0123456789ab", "attempt": 1.5}}`,
		`{"type": "attempt", "attempt": {"job_id": "job-0123456789ab", "attempt": "1"}}`,
		`{"type": "attempt", "attempt": {"job_id": "job-0123456789ab", "attempt": 2147483648}}`,
		`not json`,
	} {
		a.received([]byte(raw), w.send)
	}
	if n := len(w.messages()); n != 0 {
		t.Fatalf("answered a malformed attempt: %v", w.messages())
	}
	if s := k.snapshot(); s["received"] != 7 || s["malformed"] != 7 || s["pending"] != 0 {
		t.Fatalf("counters %v", s)
	}
}

func TestLimitsAskedAreToldNotApplied(t *testing.T) {
	a := newNodeAttempts(&attemptCounters{})
	w := newWire()
	a.received(attemptMessage(job1, 1, `{"memory": 536870912, "cpu": null}`), w.send)
	applied := w.messages()[1]["result"].(map[string]any)["applied"].(map[string]any)
	want := map[string]any{"memory": notApplied}
	if !reflect.DeepEqual(applied["limits"], want) {
		t.Fatalf("limits %v, want %v", applied["limits"], want)
	}
}

func TestMaxJobsSaysAttemptsComeOverTheStream(t *testing.T) {
	var m map[string]any
	if err := json.Unmarshal(maxJobsMessage(6), &m); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"type": "max_jobs", "max_jobs": 6.0, "attempts": "stream"}
	if !reflect.DeepEqual(m, want) {
		t.Fatalf("max_jobs %v, want %v", m, want)
	}
}
