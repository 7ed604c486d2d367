// Package gate keeps the cluster's roster for the cluster version (docs/operations.md,
// "Upgrading"): every node of the cluster, alive or not, with the log formats it reads
// and the binary it runs, and the version the leader promised. The leader raises the
// cluster version (a cluster_version entry in the log; checkpoint/cluster.go) only to a
// format every member reads, and only after promising it here.
//
// The roster is one key of the FLOW_CLUSTER bucket, changed only by compare-and-set:
// a node registers (and checks the promise) and the leader promises in the same key,
// so one of the two sees the other. A node that registers after the promise is refused
// if it cannot read the promised format; a promise made after a registration counts
// that node. Reads may be stale (a replica's); a stale read fails its compare-and-set
// and is made again.
package gate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/internal/base/port"
)

// Bucket holds the roster.
const Bucket = port.ClusterBucket

const rosterKey = "roster"

// Roster is the cluster as the gate knows it.
type Roster struct {
	// Version is the promised cluster version: the leader writes it into the log next,
	// if it is not already there. It never moves down. 0: nothing promised (version 1).
	Version int               `json:"version"`
	Members map[string]Member `json:"members"`
	// Hold, when set, keeps the version where it is (cluster hold).
	Hold *Hold `json:"hold,omitempty"`
}

// Member is one node of the cluster.
type Member struct {
	Binary  string `json:"binary,omitempty"`
	Formats []int  `json:"formats"`
	// Hold: the node was started with --hold-cluster-version.
	Hold bool `json:"hold,omitempty"`
	// Inferred: the node never said what it reads (a release before the gate); the
	// leader recorded it from its liveness report as reading format 1 only.
	Inferred bool      `json:"inferred,omitempty"`
	Since    time.Time `json:"since"`
}

// Hold is an operator's hold on the cluster version.
type Hold struct {
	By     string    `json:"by,omitempty"`
	Reason string    `json:"reason,omitempty"`
	At     time.Time `json:"at"`
}

// Reads is the newest format m reads along with every older one (formats are read
// from 1 up; a gap ends it).
func (m Member) Reads() int {
	n := 0
	for n < len(m.Formats) && slices.Contains(m.Formats, n+1) {
		n++
	}
	return n
}

// Readable is the newest format every member reads (0 with no members).
func (r Roster) Readable() int {
	low := 0
	for i, id := range r.IDs() {
		if n := r.Members[id].Reads(); i == 0 || n < low {
			low = n
		}
	}
	return low
}

// IDs are the members' node IDs, sorted.
func (r Roster) IDs() []string {
	ids := make([]string, 0, len(r.Members))
	for id := range r.Members {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}

// Holders are what holds the version: the operator's hold, and the members started
// with --hold-cluster-version ("" when nothing does).
func (r Roster) Holders() string {
	var by []string
	if r.Hold != nil {
		by = append(by, orSomeone(r.Hold.By)+"'s cluster hold")
	}
	for _, id := range r.IDs() {
		if r.Members[id].Hold {
			by = append(by, "node "+id+"'s --hold-cluster-version")
		}
	}
	return strings.Join(by, ", ")
}

func orSomeone(s string) string {
	if s == "" {
		return "an operator"
	}
	return s
}

// Next is the version the leader may promise now, given the applied one, and why
// not when it may not (0, reason). A decision of the roster alone.
func (r Roster) Next(applied int) (int, string) {
	current := max(applied, r.Version, 1)
	readable := r.Readable()
	switch {
	case len(r.Members) == 0:
		return 0, "no node has registered"
	case readable <= current && readable >= checkpoint.NewestLogFormat:
		return 0, "" // every member reads the newest format: nothing to move to
	case readable <= current:
		return 0, fmt.Sprintf("%s log formats up to %d", r.slowest(), readable)
	case r.Holders() != "":
		return 0, "held: " + r.Holders()
	}
	return readable, ""
}

// slowest names the members that read the least.
func (r Roster) slowest() string {
	low := r.Readable()
	var ids []string
	for _, id := range r.IDs() {
		if r.Members[id].Reads() == low {
			ids = append(ids, id)
		}
	}
	switch {
	case len(ids) == len(r.Members):
		return "every node reads"
	case len(ids) == 1:
		return "node " + ids[0] + " reads"
	}
	return "nodes " + strings.Join(ids, ", ") + " read"
}

// ErrTooOld: the cluster's version is newer than this binary reads.
var ErrTooOld = errors.New("gate: this flowd is too old for the cluster")

// ErrLive: a node that is live cannot be forgotten.
var ErrLive = errors.New("the node is live")

// ErrUnknown: no such member.
var ErrUnknown = errors.New("no such node in the cluster")

// Gate reads and changes the roster.
type Gate struct {
	kv port.KV
	// Tests only: afterRead runs between an update's read and its write; blind makes
	// the write unconditional (the compare-and-set's negative control).
	afterRead func()
	blind     bool
}

// New reads and changes the roster in kv (port.ClusterBucket: on JetStream,
// jsport.ClusterConfig, in file storage with no expiry: a member stays until it is
// forgotten).
func New(kv port.KV) *Gate { return &Gate{kv: kv} }

// Roster reads the roster (empty if none was written).
func (g *Gate) Roster(ctx context.Context) (Roster, error) {
	r, _, err := g.read(ctx)
	return r, err
}

func (g *Gate) read(ctx context.Context) (Roster, uint64, error) {
	r := Roster{Members: map[string]Member{}}
	e, err := g.kv.Get(ctx, rosterKey)
	if errors.Is(err, port.ErrKeyNotFound) {
		return r, 0, nil
	}
	if err != nil {
		return r, 0, fmt.Errorf("gate: read the roster: %w", err)
	}
	if err := json.Unmarshal(e.Value, &r); err != nil {
		return r, 0, fmt.Errorf("gate: the roster in %s does not decode (%v): delete the key to rebuild it (nodes register again at start)", Bucket, err)
	}
	if r.Members == nil {
		r.Members = map[string]Member{}
	}
	return r, e.Revision, nil
}

// errNoChange: change made no change; nothing is written.
var errNoChange = errors.New("no change")

// update applies change to the newest roster and writes it if nobody wrote one since
// it was read; else it reads again and retries.
func (g *Gate) update(ctx context.Context, change func(*Roster) error) (Roster, error) {
	for attempt := 0; ; attempt++ {
		r, rev, err := g.read(ctx)
		if err != nil {
			return r, err
		}
		if err := change(&r); errors.Is(err, errNoChange) {
			return r, nil
		} else if err != nil {
			return r, err
		}
		if g.afterRead != nil {
			g.afterRead()
		}
		raw, _ := json.Marshal(r)
		if g.blind {
			_, err = g.kv.Put(ctx, rosterKey, raw)
		} else if rev == 0 {
			_, err = g.kv.Create(ctx, rosterKey, raw)
		} else {
			_, err = g.kv.Update(ctx, rosterKey, raw, rev)
		}
		if err == nil {
			return r, nil
		}
		if !errors.Is(err, port.ErrKeyExists) && !errors.Is(err, port.ErrWrongRevision) || attempt >= 20 {
			return r, fmt.Errorf("gate: write the roster: %w", err)
		}
		select { // someone wrote between: read again
		case <-ctx.Done():
			return r, ctx.Err()
		case <-time.After(time.Duration(attempt+1) * 10 * time.Millisecond):
		}
	}
}

// Register records node as a member reading m.Formats, and refuses (ErrTooOld, the
// roster unchanged) if the promised version is newer than it reads: the node must not
// start. applied is the version the node's own state applied (a node restarted on an
// older binary may know more than the roster's reader).
func (g *Gate) Register(ctx context.Context, node string, m Member, applied int) (Roster, error) {
	return g.update(ctx, func(r *Roster) error {
		if need := max(r.Version, applied); need > m.Reads() {
			return fmt.Errorf("%w: the cluster version is %d, and this flowd reads log formats up to %d: start a flowd that reads format %d (the release that raised it, or a newer one)",
				ErrTooOld, need, m.Reads(), need)
		}
		if old, ok := r.Members[node]; ok {
			if old.Binary == m.Binary && slices.Equal(old.Formats, m.Formats) && old.Hold == m.Hold && !old.Inferred {
				return errNoChange
			}
			m.Since = old.Since
		}
		r.Members[node] = m
		return nil
	})
}

// Seen is what a live node says of itself in its liveness report (nodes.Report).
type Seen struct {
	Binary  string
	Formats []int // none: a release before the gate
}

// Infer records the live nodes that are not members: one that never said what it reads
// (a release before the gate) as reading format 1 only, one that did (forgotten while
// it ran) as it says.
func (g *Gate) Infer(ctx context.Context, live map[string]Seen, now time.Time) (Roster, error) {
	return g.update(ctx, func(r *Roster) error {
		added := false
		for id, seen := range live {
			if _, ok := r.Members[id]; !ok {
				m := Member{Binary: seen.Binary, Formats: seen.Formats, Since: now}
				if len(m.Formats) == 0 {
					m.Formats, m.Inferred = []int{1}, true
				}
				r.Members[id] = m
				added = true
			}
		}
		if !added {
			return errNoChange
		}
		return nil
	})
}

// Promise sets the promised version to what Next allows on the newest roster, if that
// is above applied; it returns the roster and the promised version (0: none).
func (g *Gate) Promise(ctx context.Context, applied int) (Roster, int, error) {
	promised := 0
	r, err := g.update(ctx, func(r *Roster) error {
		promised = 0 // a retry after a failed write decides again
		next, _ := r.Next(applied)
		if next == 0 {
			return errNoChange
		}
		r.Version, promised = next, next
		return nil
	})
	return r, promised, err
}

// Forget removes a member that is gone for good. live says whether it is live now: a
// live node is refused (it would be recorded again at once).
func (g *Gate) Forget(ctx context.Context, node string, live bool) (Roster, error) {
	if live {
		return Roster{}, fmt.Errorf("%w: node %s reports itself alive: stop it before forgetting it (a clean stop, SIGTERM, says goodbye: it can be forgotten at once; a node killed says none: its report lapses a minute after its last)", ErrLive, node)
	}
	return g.update(ctx, func(r *Roster) error {
		if _, ok := r.Members[node]; !ok {
			return fmt.Errorf("%w: node %q is not a member (cluster status lists them)", ErrUnknown, node)
		}
		delete(r.Members, node)
		return nil
	})
}

// SetHold sets (h != nil) or releases (h == nil) the operator's hold.
func (g *Gate) SetHold(ctx context.Context, h *Hold) (Roster, error) {
	return g.update(ctx, func(r *Roster) error {
		if h == nil && r.Hold == nil {
			return errNoChange
		}
		r.Hold = h
		return nil
	})
}
