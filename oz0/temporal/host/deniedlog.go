package main

import (
	"sync"
	"time"

	"go.temporal.io/server/common/authorization"
	"go.temporal.io/server/common/log"
	"go.temporal.io/server/common/log/tag"
)

// A refused call is worth a log line (a misbehaving node, a stale operator certificate), but
// a caller repeating it must not flood the log: one line per caller, API and reason per
// interval.
const (
	deniedLogEvery = time.Minute
	deniedLogKeys  = 10000 // beyond this many distinct (caller, API, reason), start afresh
)

type deniedLog struct {
	logger log.Logger
	mu     sync.Mutex
	last   map[[3]string]time.Time
	now    func() time.Time
}

func newDeniedLog(logger log.Logger) *deniedLog {
	return &deniedLog{logger: logger, last: map[[3]string]time.Time{}, now: time.Now}
}

// record logs the refusal unless the same caller was refused the same API for the same
// reason recently.
// It reports whether it logged. A nil deniedLog logs nothing.
func (d *deniedLog) record(subject string, target *authorization.CallTarget, reason string) bool {
	if d == nil || d.logger == nil {
		return false
	}
	key := [3]string{subject, target.APIName, reason}
	now := d.now()
	d.mu.Lock()
	if at, seen := d.last[key]; seen && now.Sub(at) < deniedLogEvery {
		d.mu.Unlock()
		return false
	}
	if len(d.last) >= deniedLogKeys {
		d.last = map[[3]string]time.Time{}
	}
	d.last[key] = now
	d.mu.Unlock()
	d.logger.Warn("oz0: call refused",
		tag.NewStringTag("identity", subject),
		tag.NewStringTag("api", target.APIName),
		tag.WorkflowNamespace(target.Namespace),
		tag.NewStringTag("reason", reason))
	return true
}
