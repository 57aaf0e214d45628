package main

// `hold`: one control stream per node, answered as the agent answers it (heartbeats at the
// welcome's interval, three silent intervals end a stream, `edges` followed, reconnects by
// the agent's policy), until SIGTERM, SIGINT or --duration.
//
// A stream costs one goroutine (its reader) and a timer (its heartbeats): silence is the
// reader's deadline, so nothing scans the streams but the stats line.

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"maps"
	"math"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gorilla/websocket"
)

const (
	defaultHeartbeat = 5 * time.Second
	missedHeartbeats = 3
	// After the stop, streams get this long to close before the summary is printed anyway.
	stopTimeout = 2*closeTimeout + sendTimeout
)

var heartbeatMessage = []byte(`{"type":"heartbeat"}`)

type holdOptions struct {
	edges []string
	from  *sources
	quiet bool
	// With --run-attempts: the max_jobs each node states, taking attempts over the stream.
	runAttempts bool
	maxJobs     int
}

// counters are shared by every stream; maps under mu, the rest atomic.
type counters struct {
	mu         sync.Mutex
	refused    map[string]int
	failed     map[string]int
	ended      map[string]int
	welcomed   atomic.Int64
	reconnects atomic.Int64
	connecting atomic.Int64
	heartbeats atomic.Int64
	hbErrors   atomic.Int64
	// Longest gap between two messages from the edge on one stream, in nanoseconds: in
	// this stats window, and overall.
	gapWindow  atomic.Int64
	gapOverall atomic.Int64
	// The streams open now (welcomed, not ended): for `alive`.
	live   map[*stream]struct{}
	liveMu sync.Mutex
	// With --run-attempts, the attempts' counts.
	attempts *attemptCounters
}

func (c *counters) count(m map[string]int, key string) {
	c.mu.Lock()
	m[key]++
	c.mu.Unlock()
}

func (c *counters) snapshot() (refused, failed, ended map[string]int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.refused), maps.Clone(c.failed), maps.Clone(c.ended)
}

func storeMax(v *atomic.Int64, x int64) {
	for {
		old := v.Load()
		if x <= old || v.CompareAndSwap(old, x) {
			return
		}
	}
}

type holdNode struct {
	id    string
	cfg   *tls.Config
	edges []string
	// With --run-attempts: the attempts it ran, across its streams.
	attempts *nodeAttempts
}

type stream struct {
	c         *conn
	lastHeard atomic.Int64 // sinceStart() when the edge was last heard
	beat      *time.Timer
	heartbeat time.Duration
	stopping  atomic.Bool
	sendErr   atomic.Bool
}

func runHold(args []string) error {
	fs := flag.NewFlagSet("hold", flag.ContinueOnError)
	var edges listFlag
	var from sources
	from.register(fs)
	fs.Var(&edges, "edge", "an edge, HOST:PORT, repeatable; node i starts on edge i mod count")
	caPath := fs.String("ca", "", "the cluster CA certificate (PEM)")
	dir := fs.String("nodes-dir", "", "the directory `join --out` wrote")
	limit := fs.Int("limit", 0, "hold only the first N nodes (0: all)")
	ramp := fs.Int("ramp-batch", 50, "streams opened at a time; the next batch starts when each has been welcomed or refused")
	duration := fs.Float64("duration", 0, "seconds to hold after the ramp (0: until SIGTERM)")
	statsEvery := fs.Float64("stats-every", 10, "seconds between stats lines")
	quiet := fs.Bool("quiet-events", false, "print only the stats and summary lines")
	heapProfile := fs.String("heap-profile", "", "write a heap profile (pprof) here when stopping, before the streams close")
	runAttempts := fs.Bool("run-attempts", false, "take attempts over the stream (max_jobs with attempts \"stream\") and run each at once: started, then ended exit 0")
	maxJobs := fs.Int("max-jobs", defaultMaxJobs, "with --run-attempts: the max_jobs each node states (1-256)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if len(edges) == 0 || *caPath == "" || *dir == "" {
		return usageError{"hold needs --edge, --ca and --nodes-dir"}
	}
	for _, e := range edges {
		if err := checkEdge(e); err != nil {
			return err
		}
	}
	if err := from.check(); err != nil {
		return err
	}
	if *limit < 0 || *ramp < 1 || *duration < 0 || *statsEvery <= 0 {
		return usageError{"--limit and --duration must not be negative, --ramp-batch and --stats-every must be positive"}
	}
	if *maxJobs < 1 || *maxJobs > 256 {
		return usageError{"--max-jobs must be 1 to 256"}
	}
	roots, err := loadCA(*caPath)
	if err != nil {
		return usageError{err.Error()}
	}
	nodes, err := readNodes(filepath.Join(*dir, nodesFile), *limit, roots, edges)
	if err != nil {
		return err
	}
	if err := from.checkCount(len(nodes)); err != nil {
		return err
	}
	opts := holdOptions{edges: edges, from: &from, quiet: *quiet, runAttempts: *runAttempts, maxJobs: *maxJobs}

	signalled, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	// --duration counts from the end of the ramp.
	ctx, cancel := context.WithCancel(signalled)
	defer cancel()
	k := &counters{
		refused: map[string]int{}, failed: map[string]int{}, ended: map[string]int{},
		live: map[*stream]struct{}{},
	}
	if opts.runAttempts {
		k.attempts = &attemptCounters{}
		for _, n := range nodes {
			n.attempts = newNodeAttempts(k.attempts)
		}
	}
	began := monotonic()
	total := startCPU()
	window := startCPU()
	statsDone := make(chan struct{})
	go func() {
		defer close(statsDone)
		ticker := time.NewTicker(seconds(*statsEvery))
		defer ticker.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-ticker.C:
				stdout.line(statsLine(k, "stats", window.take(), began))
			}
		}
	}()

	progress("holding %d nodes, %d at a time in the ramp", len(nodes), *ramp)
	var all sync.WaitGroup
	for start := 0; start < len(nodes) && ctx.Err() == nil; start += *ramp {
		batch := nodes[start:min(start+*ramp, len(nodes))]
		var settled sync.WaitGroup
		for i, n := range batch {
			settled.Add(1)
			all.Add(1)
			go func() {
				defer all.Done()
				runNode(ctx, n, start+i, opts, k, settled.Done)
			}()
		}
		settled.Wait()
	}
	progress("ramp done: %d welcomed", k.welcomed.Load())
	// The handshakes' garbage is not what an idle stream costs: give it back now rather
	// than when the scavenger gets to it, so RSS shows the streams.
	debug.FreeOSMemory()
	if *duration > 0 {
		time.AfterFunc(seconds(*duration), cancel)
	}
	<-ctx.Done()
	if *heapProfile != "" {
		writeHeapProfile(*heapProfile)
	}
	k.liveMu.Lock()
	open := len(k.live)
	k.liveMu.Unlock()
	progress("stopping: closing %d streams", open)
	finished := make(chan struct{})
	go func() { all.Wait(); close(finished) }()
	timedOut := false
	select {
	case <-finished:
	case <-time.After(stopTimeout):
		timedOut = true
	}
	<-statsDone
	summary := statsLine(k, "summary", total.take(), began)
	summary["stop_timed_out"] = timedOut
	stdout.line(summary)
	return nil
}

func writeHeapProfile(path string) {
	f, err := os.Create(path)
	if err == nil {
		runtime.GC() // the profile shows what is live
		err = pprof.WriteHeapProfile(f)
		_ = f.Close()
	}
	if err != nil {
		progress("cannot write the heap profile: %s", err)
	}
}

func readNodes(path string, limit int, roots *x509.CertPool, edges []string) ([]*holdNode, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, usageError{fmt.Sprintf("cannot read the nodes: %s", err)}
	}
	defer f.Close()
	var nodes []*holdNode
	scanner := bufio.NewScanner(f)
	scanner.Buffer(make([]byte, 64*1024), 1024*1024)
	for line := 1; scanner.Scan() && (limit == 0 || len(nodes) < limit); line++ {
		var rec nodeRecord
		if err := json.Unmarshal(scanner.Bytes(), &rec); err != nil || rec.NodeID == "" {
			return nil, usageError{fmt.Sprintf("%s line %d is not a node record", path, line)}
		}
		cert, err := tls.X509KeyPair([]byte(rec.CertPEM), []byte(rec.KeyPEM))
		if err != nil {
			return nil, usageError{fmt.Sprintf("%s line %d: %s", path, line, err)}
		}
		nodes = append(nodes, &holdNode{id: rec.NodeID, cfg: tlsConfig(roots, &cert), edges: edges})
	}
	if err := scanner.Err(); err != nil {
		return nil, fmt.Errorf("cannot read %s: %w", path, err)
	}
	if len(nodes) == 0 {
		return nil, usageError{fmt.Sprintf("%s holds no nodes", path)}
	}
	return nodes, nil
}

func statsLine(k *counters, kind string, cpuPct, began float64) map[string]any {
	now := sinceStart()
	alive, open := 0, 0
	k.liveMu.Lock()
	for s := range k.live {
		open++
		if time.Duration(now-s.lastHeard.Load()) < missedHeartbeats*s.heartbeat {
			alive++
		}
	}
	k.liveMu.Unlock()
	refused, failed, ended := k.snapshot()
	var mem runtime.MemStats
	runtime.ReadMemStats(&mem)
	line := map[string]any{
		"event":            kind,
		"t":                monotonic(),
		"elapsed_s":        round1(monotonic() - began),
		"streams_alive":    alive,
		"streams_open":     open,
		"connecting":       k.connecting.Load(),
		"welcomed_total":   k.welcomed.Load(),
		"reconnects":       k.reconnects.Load(),
		"refused":          refused,
		"failed":           failed,
		"ended":            ended,
		"heartbeats_sent":  k.heartbeats.Load(),
		"heartbeat_errors": k.hbErrors.Load(),
		"max_gap_s_window": round2(time.Duration(k.gapWindow.Swap(0)).Seconds()),
		"max_gap_s":        round2(time.Duration(k.gapOverall.Load()).Seconds()),
		"rss_mib":          rssMiB(),
		"go_heap_mib":      round1(float64(mem.HeapInuse) / (1 << 20)),
		"go_stacks_mib":    round1(float64(mem.StackInuse) / (1 << 20)),
		"cpu_pct":          cpuPct,
		"goroutines":       runtime.NumGoroutine(),
	}
	if k.attempts != nil {
		line["attempts"] = k.attempts.snapshot()
	}
	return line
}

func (o holdOptions) event(kind, node, edge string, extra map[string]any) {
	if o.quiet {
		return
	}
	line := map[string]any{"event": kind, "t": monotonic(), "node": node, "edge": edge}
	maps.Copy(line, extra)
	stdout.line(line)
}

// outcome is how one attempt ended, for the reconnect policy.
type outcome int

const (
	failedAttempt outcome = iota // no answer: the next edge
	ended                        // a stream that was up ended: the next edge
	refusedRetry                 // refused for now: the same edge, at the refusals' pace
	refusedFinal                 // rejected, unknown, purge: the agent would stop
	stopped                      // we are stopping
)

// runNode keeps NODE's stream up until CTX ends or the node is refused for good. SETTLED
// is called once, when the node has had an answer (welcome or refusal) or we stop: a ramp
// that waits for it goes at the edge's pace, however often attempts fail before that.
func runNode(ctx context.Context, n *holdNode, index int, o holdOptions, k *counters, settled func()) {
	policy := reconnect{next: index % len(n.edges)}
	source := o.from.of(index)
	var once sync.Once
	settle := func() { once.Do(settled) }
	defer settle()
	for attempts := 0; ; attempts++ {
		if delay := policy.nextDelay(); delay > 0 {
			timer := time.NewTimer(delay)
			select {
			case <-ctx.Done():
				timer.Stop()
			case <-timer.C:
			}
		}
		if ctx.Err() != nil {
			return
		}
		edge := policy.take(n.edges)
		if attempts > 0 {
			k.reconnects.Add(1)
		}
		result := attempt(ctx, n, edge, source, o, k, &policy, settle)
		switch result {
		case failedAttempt, ended:
			policy.elsewhere(len(n.edges))
		case refusedRetry:
			settle()
			policy.sameEdgeAgain(true)
		case refusedFinal, stopped:
			return
		}
	}
}

// attempt is one connection to EDGE: connect, hello, welcome, then the live stream.
func attempt(ctx context.Context, n *holdNode, edge, source string, o holdOptions, k *counters,
	policy *reconnect, welcomed func()) outcome {
	k.connecting.Add(1)
	connected := false
	defer func() {
		if !connected {
			k.connecting.Add(-1)
		}
	}()
	c, err := open(ctx, edge, "/control", n.cfg, source)
	if err != nil {
		if ctx.Err() != nil {
			return stopped
		}
		why := errorKind(err)
		k.count(k.failed, why)
		o.event("failed", n.id, edge, map[string]any{"why": why})
		return failedAttempt
	}
	s := &stream{c: c, heartbeat: defaultHeartbeat}
	// Stopping: a close frame, then the edge's answer (or the deadline) ends the reader.
	unregister := context.AfterFunc(ctx, func() {
		s.stopping.Store(true)
		if c.closeFrame() == nil {
			_ = c.ws.SetReadDeadline(time.Now().Add(closeTimeout))
		} else {
			_ = c.ws.Close()
		}
	})
	defer func() {
		unregister()
		_ = c.ws.Close()
	}()
	fail := func(stage string, err error) outcome {
		if s.stopping.Load() {
			return stopped
		}
		why := stage + ":" + errorKind(err)
		k.count(k.failed, why)
		o.event("failed", n.id, edge, map[string]any{"why": why})
		return failedAttempt
	}
	hello, _, err := c.receive(helloTimeout)
	if err != nil {
		return fail("hello", err)
	}
	if hello.Type != "hello" {
		return fail("hello", fmt.Errorf("unexpected %q", hello.Type))
	}
	answer, _, err := c.receive(helloTimeout)
	if err != nil {
		return fail("welcome", err)
	}
	switch answer.Type {
	case "welcome":
	case "refused":
		return refused(n, edge, answer.Code, o, k, c)
	case "purge":
		// A load generator holds no files to purge: it stops this node, as the agent
		// exits after a purge, without answering (the edge then ends the stream).
		o.event("purge", n.id, edge, nil)
		c.closeGracefully()
		return refusedFinal
	default:
		return fail("welcome", fmt.Errorf("unexpected %q", answer.Type))
	}
	if answer.Heartbeat > 0 {
		s.heartbeat = seconds(answer.Heartbeat)
	}
	n.edges = mergeEdges(n.edges, answer.Edges)
	connected = true
	k.connecting.Add(-1)
	k.welcomed.Add(1)
	o.event("welcome", n.id, edge, map[string]any{"server": answer.Server})
	welcomed()
	policy.streamUp()
	defer policy.streamDown()
	return s.live(n, edge, o, k)
}

// refused counts and tells a refusal; the edge closes after it.
func refused(n *holdNode, edge, code string, o holdOptions, k *counters, c *conn) outcome {
	k.count(k.refused, code)
	// The agent asks again when blocked, pending or purging; stops when rejected or
	// unknown; any other code is an edge it cannot use now (the next edge).
	result := failedAttempt
	switch code {
	case "blocked", "pending", "purging":
		result = refusedRetry
	case "rejected", "unknown":
		result = refusedFinal
	}
	o.event("refused", n.id, edge, map[string]any{"code": code, "retrying": result != refusedFinal})
	c.closeGracefully()
	return result
}

// live reads the welcomed stream until it ends, heartbeating on a timer of its own.
func (s *stream) live(n *holdNode, edge string, o holdOptions, k *counters) outcome {
	s.lastHeard.Store(sinceStart())
	k.liveMu.Lock()
	k.live[s] = struct{}{}
	k.liveMu.Unlock()
	defer func() {
		k.liveMu.Lock()
		delete(k.live, s)
		k.liveMu.Unlock()
	}()
	// Made stopped, then started: the callback reads s.beat only after it is set.
	s.beat = time.AfterFunc(math.MaxInt64, func() { s.sendHeartbeat(k) })
	s.beat.Reset(s.heartbeat)
	defer s.beat.Stop()
	if n.attempts != nil {
		// As the agent, once welcomed: how many it runs at once, and that it takes
		// attempts over the stream; the ends not acked go on this stream from now.
		n.attempts.attach(s.c.send)
		defer n.attempts.detach()
		if err := s.c.send(maxJobsMessage(o.maxJobs)); err != nil {
			_ = s.c.ws.Close() // ends the reader
		}
	}
	last := time.Now()
	for {
		if !s.stopping.Load() {
			_ = s.c.ws.SetReadDeadline(time.Now().Add(missedHeartbeats * s.heartbeat))
		}
		m, raw, err := s.c.receive(0)
		if err != nil {
			return s.ended(n, edge, o, k, err)
		}
		now := time.Now()
		gap := int64(now.Sub(last))
		last = now
		s.lastHeard.Store(sinceStart())
		storeMax(&k.gapWindow, gap)
		storeMax(&k.gapOverall, gap)
		switch m.Type {
		case "edges":
			n.edges = mergeEdges(n.edges, m.Edges)
		case "refused":
			return refused(n, edge, m.Code, o, k, s.c)
		case "purge":
			o.event("purge", n.id, edge, nil)
			s.c.closeGracefully()
			return refusedFinal
		case "attempt":
			if n.attempts != nil {
				n.attempts.received(raw, s.c.send)
			}
		case "attempt_done_ack":
			if n.attempts != nil {
				n.attempts.acked(raw)
			}
		}
	}
}

func (s *stream) sendHeartbeat(k *counters) {
	if s.stopping.Load() {
		return
	}
	if err := s.c.send(heartbeatMessage); err != nil {
		k.hbErrors.Add(1)
		s.sendErr.Store(true)
		_ = s.c.ws.Close() // ends the reader
		return
	}
	k.heartbeats.Add(1)
	s.beat.Reset(s.heartbeat)
}

// sinceStart is monotonic time since this process started, in nanoseconds.
func sinceStart() int64 { return int64(time.Since(processStart)) }

var processStart = time.Now()

func (s *stream) ended(n *holdNode, edge string, o holdOptions, k *counters, err error) outcome {
	var ce *websocket.CloseError
	switch {
	case s.stopping.Load():
		k.count(k.ended, "stopped")
		o.event("closed", n.id, edge, map[string]any{"why": "stopped"})
		return stopped
	case s.sendErr.Load():
		k.count(k.ended, "heartbeat_send")
		o.event("lost", n.id, edge, map[string]any{"why": "heartbeat_send"})
	case errors.As(err, &ce):
		why := fmt.Sprintf("close:%d", ce.Code)
		k.count(k.ended, why)
		o.event("closed", n.id, edge, map[string]any{"why": why})
	default:
		why := errorKind(err)
		if why == "timeout" {
			why = "silent" // three heartbeats without a word from the edge
		}
		k.count(k.ended, why)
		o.event("lost", n.id, edge, map[string]any{"why": why})
	}
	return ended
}
