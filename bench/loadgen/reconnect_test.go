package main

import (
	"slices"
	"testing"
	"time"
)

func TestReconnectFollowsTheAgentsPolicy(t *testing.T) {
	edges := []string{"a:1", "b:1", "c:1"}
	r := reconnect{next: 1}
	if d := r.nextDelay(); d != 0 {
		t.Fatalf("first attempt waits %v, want 0", d)
	}
	if e := r.take(edges); e != "b:1" {
		t.Fatalf("first edge %s, want b:1 (node index 1)", e)
	}
	for n := 1; n <= 8; n++ {
		bound := seconds(min(maxDelay, baseDelay*float64(int(1)<<(n-1))))
		if d := r.nextDelay(); d < 0 || d > bound {
			t.Fatalf("wait before attempt %d is %v, want within [0, %v]", n, d, bound)
		}
		r.take(edges)
	}
	r.sameEdgeAgain(true)
	d := r.nextDelay()
	if d < 2*time.Second || d > 4*time.Second {
		t.Fatalf("after a refusal the wait is %v, want 2-4 s", d)
	}
	before := r.next
	r.take(edges)
	if r.next != before+1 || r.refused {
		t.Fatal("a refusal's wait applies once, to the same edge")
	}
}

func TestMergeEdgesKeepsKnownOrderAndSharesUnchangedLists(t *testing.T) {
	known := []string{"a:1", "b:1"}
	if got := mergeEdges(known, []string{"b:1", "bad", "a:1"}); &got[0] != &known[0] {
		t.Fatal("nothing new must keep the same list")
	}
	got := mergeEdges(known, []string{"c:1", "a:1"})
	if !slices.Equal(got, []string{"a:1", "b:1", "c:1"}) || len(known) != 2 {
		t.Fatalf("merged %v (known now %v)", got, known)
	}
}
