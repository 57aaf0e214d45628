package main

import "container/list"

// maxTaskTokensPerNode bounds what the host remembers for one node: far more tasks than a
// node runs at once (its runtime takes 4), so only tokens of tasks that ended without an
// answer (timed out) are ever dropped, oldest first.
const maxTaskTokensPerNode = 1024

// taskTokens is a bounded set of task tokens, forgetting the oldest when full.
type taskTokens struct {
	limit int
	order *list.List // of string, oldest first
	index map[string]*list.Element
}

func newTaskTokens(limit int) *taskTokens {
	return &taskTokens{limit: limit, order: list.New(), index: map[string]*list.Element{}}
}

func (t *taskTokens) add(token []byte) {
	key := string(token)
	if el, ok := t.index[key]; ok {
		t.order.MoveToBack(el)
		return
	}
	t.index[key] = t.order.PushBack(key)
	for t.order.Len() > t.limit {
		oldest := t.order.Front()
		t.order.Remove(oldest)
		delete(t.index, oldest.Value.(string))
	}
}

// has is false for a nil set and an empty token.
func (t *taskTokens) has(token []byte) bool {
	if t == nil || len(token) == 0 {
		return false
	}
	_, ok := t.index[string(token)]
	return ok
}

func (t *taskTokens) remove(token []byte) {
	if el, ok := t.index[string(token)]; ok {
		t.order.Remove(el)
		delete(t.index, string(token))
	}
}

func (t *taskTokens) len() int { return t.order.Len() }
