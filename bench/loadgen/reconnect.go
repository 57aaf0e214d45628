package main

// When and where a node tries next: the agent's policy (oz0_node/reconnect.py). The first
// attempt is immediate; then attempt n waits uniform in [0, min(5 s, 0.2 s * 2**n)] on the
// next edge; a stream that stayed up 30 s resets n. After a refusal (blocked, pending,
// purging) the same edge is asked again after a wait uniform in [2 s, 4 s].

import (
	"math/rand/v2"
	"time"
)

const (
	baseDelay   = 0.2
	maxDelay    = 5.0
	stableAfter = 30 * time.Second
	refusedMin  = 2.0
	refusedMax  = 4.0
	maxExponent = 16
)

type reconnect struct {
	retries int
	started bool
	next    int
	refused bool
	upSince time.Time
}

// nextDelay is the wait before the next attempt; nextEdge then names its edge.
func (r *reconnect) nextDelay() time.Duration {
	if !r.started {
		return 0
	}
	if r.refused {
		return seconds(refusedMin + rand.Float64()*(refusedMax-refusedMin))
	}
	bound := min(maxDelay, baseDelay*float64(int(1)<<min(r.retries, maxExponent)))
	return seconds(rand.Float64() * bound)
}

// take moves the policy on to the attempt after the wait nextDelay gave.
func (r *reconnect) take(edges []string) string {
	r.refused = false
	if r.started {
		r.retries++
	}
	r.started = true
	edge := edges[r.next%len(edges)]
	r.next++
	return edge
}

// sameEdgeAgain: the last edge answered; ask it again, at the refusals' pace if REFUSED.
func (r *reconnect) sameEdgeAgain(refused bool) {
	r.next--
	r.refused = refused
}

// elsewhere: the last edge could not be reached or its stream was lost; the next attempt
// goes to one of the others at random, as the agent's Reconnect.elsewhere does.
func (r *reconnect) elsewhere(edges int) {
	if others := edges - 1; others > 1 {
		r.next += rand.IntN(others)
	}
}

func (r *reconnect) streamUp() { r.upSince = time.Now() }

func (r *reconnect) streamDown() {
	if !r.upSince.IsZero() && time.Since(r.upSince) >= stableAfter {
		r.retries = 0
	}
	r.upSince = time.Time{}
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// mergeEdges is KNOWN followed by what is new in NEW, in order (the agent's merge);
// KNOWN itself when nothing is new, so nodes share one list until they learn of more.
func mergeEdges(known, new []string) []string {
	merged := known
	copied := false
	for _, e := range new {
		if checkEdge(e) != nil {
			continue
		}
		found := false
		for _, k := range merged {
			if k == e {
				found = true
				break
			}
		}
		if !found {
			if !copied {
				merged = append([]string(nil), merged...)
				copied = true
			}
			merged = append(merged, e)
		}
	}
	return merged
}
