package workflow

import (
	"fmt"
	"time"

	"go.yaml.in/yaml/v3"
)

// RateLimit is a step's `rate_limit: {key, limit, per}`: across the whole cluster, the
// step attempts of every run and workflow that name Key start at most Limit times per
// Per, evenly spaced (engine/internal/rates; docs/workflow-spec.md "Rate limits").
//
// Key is a literal name, not a template: a rate is a downstream's (the wallet's), and
// its name is a metric label and a row of `flowctl limits`; a key per input would make
// both unbounded. Workflows that name one key share its bucket; each step spaces its
// own starts by its own declaration, so they should declare the same rate.
type RateLimit struct {
	Key   string   `json:"key"`
	Limit int      `json:"limit"`
	Per   Duration `json:"per"`
}

// Limits of a rate declaration.
const (
	MaxRateLimit = 1_000_000
	MinRatePer   = time.Millisecond
	MaxRatePer   = 24 * time.Hour
	// MinRateInterval is the shortest spacing (Per/Limit) a rate may ask for, 1000
	// starts a second: a reservation is three round trips to one replicated entry
	// (0.17 ms on loopback, more with contention and replicas: docs/perf.md), so a
	// key cannot pace much finer.
	MinRateInterval = time.Millisecond
)

// Interval is the spacing of the rate's starts: Per/Limit.
func (r RateLimit) Interval() time.Duration { return time.Duration(r.Per) / time.Duration(r.Limit) }

// String is "wallet 50/1s".
func (r RateLimit) String() string {
	return fmt.Sprintf("%s %d/%s", r.Key, r.Limit, time.Duration(r.Per))
}

// rateLimit reads a step's `rate_limit:`.
func (l *loader) rateLimit(n *yaml.Node) *RateLimit {
	const example = "e.g. rate_limit: {key: wallet, limit: 50, per: 1s}"
	r := RateLimit{}
	var keyNode, perNode *yaml.Node
	l.mapping(n, "a rate limit", []string{"key", "limit", "per"}, func(key string, _, v *yaml.Node) {
		switch key {
		case "key":
			r.Key, keyNode = l.str(v, "rate_limit key"), v
		case "limit":
			r.Limit = l.integer(v, "rate_limit limit", 1, MaxRateLimit)
		case "per":
			r.Per, perNode = l.duration(v, "rate_limit per"), v
		}
	})
	if n.Kind != yaml.MappingNode {
		return nil
	}
	if keyNode == nil || r.Limit == 0 || r.Per == 0 {
		if keyNode != nil && perNode != nil && r.Limit == 0 {
			return nil // the limit's own error is said
		}
		l.fail(n, example, "a rate limit needs key, limit and per")
		return nil
	}
	if !ValidLabel(r.Key) {
		l.fail(keyNode, "a name of 1-63 of a-z, 0-9, '-' and '_' (the downstream's: wallet)", "rate_limit key %q is not allowed", r.Key)
		return nil
	}
	if d := time.Duration(r.Per); d < MinRatePer || d > MaxRatePer {
		l.fail(perNode, fmt.Sprintf("a duration from %s to %s", MinRatePer, MaxRatePer), "rate_limit per %s is out of range", d)
		return nil
	}
	if r.Interval() < MinRateInterval {
		l.fail(n, fmt.Sprintf("at most one start per %s (e.g. limit: 1000, per: 1s)", MinRateInterval), "rate_limit %d per %s is finer than the cluster can pace", r.Limit, time.Duration(r.Per))
		return nil
	}
	return &r
}

// RateLimits are the workflow's rate-limited steps' rates, by step name (handlers'
// steps included).
func (w *Workflow) RateLimits() map[string]RateLimit {
	out := map[string]RateLimit{}
	add := func(sts []*Step) {
		for _, st := range sts {
			if st.RateLimit != nil {
				out[st.Name] = *st.RateLimit
			}
		}
	}
	add(w.Steps)
	for _, hs := range w.Handlers {
		add(hs)
	}
	return out
}
