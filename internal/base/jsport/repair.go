package jsport

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// RepairCommand is what an operator runs to repair flow's streams and buckets
// (docs/security.md, "Sealing and repair").
const RepairCommand = "flowctl cluster repair"

// Want is what flow wants one of its streams (or buckets) to be: the settings a start
// would give it, the ones whose change breaks flow. A node's credential cannot change
// a stream's configuration (client/roles.go): only Repair, on an admin path, does.
type Want struct {
	Name        string   // the stream's name (KV_FLOW_LEADER for the bucket FLOW_LEADER)
	Subjects    []string // the subjects it captures
	MaxAge      time.Duration
	MaxBytes    int64 // -1: no cap
	Discard     jetstream.DiscardPolicy
	DenyDelete  bool // a bucket's streams deny message deletes (nats.go sets it)
	AllowRollup bool // buckets and object stores need rollups
	// Create creates it as flow does (after a delete, for Recreate).
	Create func(ctx context.Context, js jetstream.JetStream) error
	// Recreate says repair may delete and recreate it: what it holds is soft state that
	// flow rebuilds (leases, the leader key, the nodes' reports, tasks). Otherwise
	// Refuse says why not.
	Recreate bool
	Refuse   string
	// KeepSequence: a recreated stream continues above the old one's last sequence
	// (the leader bucket, whose revisions are terms).
	KeepSequence bool
}

// WantKV is a bucket as nats.go's CreateKeyValue makes it from cfg.
func WantKV(cfg jetstream.KeyValueConfig) Want {
	maxBytes := cfg.MaxBytes
	if maxBytes == 0 {
		maxBytes = -1
	}
	return Want{Name: "KV_" + cfg.Bucket, Subjects: []string{"$KV." + cfg.Bucket + ".>"}, MaxAge: cfg.TTL, MaxBytes: maxBytes,
		Discard: jetstream.DiscardNew, DenyDelete: true, AllowRollup: true,
		Create: func(ctx context.Context, js jetstream.JetStream) error {
			_, err := js.CreateKeyValue(ctx, cfg)
			return err
		}}
}

// WantStream is a stream as CreateStream makes it from cfg.
func WantStream(cfg jetstream.StreamConfig) Want {
	maxBytes := cfg.MaxBytes
	if maxBytes == 0 {
		maxBytes = -1
	}
	return Want{Name: cfg.Name, Subjects: cfg.Subjects, MaxAge: cfg.MaxAge, MaxBytes: maxBytes, Discard: cfg.Discard,
		DenyDelete: cfg.DenyDelete, AllowRollup: cfg.AllowRollup,
		Create: func(ctx context.Context, js jetstream.JetStream) error {
			_, err := js.CreateStream(ctx, cfg)
			return err
		}}
}

// WantObjectStore is an object store as CreateObjectStore makes it from cfg.
func WantObjectStore(cfg jetstream.ObjectStoreConfig) Want {
	maxBytes := cfg.MaxBytes
	if maxBytes == 0 {
		maxBytes = -1
	}
	return Want{Name: "OBJ_" + cfg.Bucket, Subjects: []string{"$O." + cfg.Bucket + ".C.>", "$O." + cfg.Bucket + ".M.>"},
		MaxAge: cfg.TTL, MaxBytes: maxBytes, Discard: jetstream.DiscardNew, AllowRollup: true,
		Create: func(ctx context.Context, js jetstream.JetStream) error {
			_, err := js.CreateObjectStore(ctx, cfg)
			return err
		}}
}

// Finding is a stream that differs from what flow wants, and what repair did (or, on
// a dry run or a check, would do) about it.
type Finding struct {
	Stream   string   `json:"stream"`
	Problems []string `json:"problems"`
	// Sealed: NATS never unseals a stream; only a delete and a new one mend it.
	Sealed bool `json:"sealed,omitempty"`
	// Action is "update" (its settings set back), "recreate" (deleted and created anew,
	// what it held lost), or "refuse"; Done says whether repair did it (false on a dry
	// run and on a refusal), Note why it refuses or what a recreate loses.
	Action string `json:"action"`
	Done   bool   `json:"done,omitempty"`
	Note   string `json:"note,omitempty"`
	Error  string `json:"error,omitempty"`
}

// String is the finding in one line, for logs and readyz.
func (f Finding) String() string {
	s := f.Stream + ": " + strings.Join(f.Problems, ", ")
	if f.Action == "refuse" {
		return s + " (" + RepairCommand + " cannot mend it: " + f.Note + ")"
	}
	return s + " (run `" + RepairCommand + "`)"
}

// Check compares flow's streams with what it wants; a stream that does not exist yet
// is no finding (a start creates it). It needs only a stream's info.
func Check(ctx context.Context, js jetstream.JetStream, wants []Want) ([]Finding, error) {
	var out []Finding
	for _, w := range wants {
		s, err := js.Stream(ctx, w.Name)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			continue
		}
		if err != nil {
			return out, fmt.Errorf("streams: check %s: %w", w.Name, err)
		}
		if f, ok := compare(w, s.CachedInfo().Config); ok {
			out = append(out, f)
		}
	}
	return out, nil
}

// compare is w's finding about cfg, if cfg differs.
func compare(w Want, c jetstream.StreamConfig) (Finding, bool) {
	f := Finding{Stream: w.Name, Sealed: c.Sealed}
	if c.Sealed {
		// Sealing sets max age, discard, the deny flags and rollups itself (the
		// server's stream update): only the seal is worth saying.
		f.Problems = append(f.Problems, "sealed (nothing can be written to it, and NATS never unseals a stream)")
		c.MaxAge, c.Discard, c.DenyDelete, c.DenyPurge, c.AllowRollup = w.MaxAge, w.Discard, w.DenyDelete, false, w.AllowRollup
	}
	if c.DenyPurge {
		f.Problems = append(f.Problems, "deny_purge set")
	}
	if c.DenyDelete != w.DenyDelete {
		f.Problems = append(f.Problems, fmt.Sprintf("deny_delete %v, flow wants %v", c.DenyDelete, w.DenyDelete))
	}
	if c.AllowRollup != w.AllowRollup {
		f.Problems = append(f.Problems, fmt.Sprintf("allow_rollup_hdrs %v, flow wants %v", c.AllowRollup, w.AllowRollup))
	}
	if c.MaxAge != w.MaxAge {
		f.Problems = append(f.Problems, fmt.Sprintf("max age (TTL) %v, flow wants %v", c.MaxAge, w.MaxAge))
	}
	if c.MaxBytes != w.MaxBytes {
		f.Problems = append(f.Problems, fmt.Sprintf("max bytes %d, flow wants %d", c.MaxBytes, w.MaxBytes))
	}
	if c.Discard != w.Discard {
		f.Problems = append(f.Problems, fmt.Sprintf("discard %v, flow wants %v", c.Discard, w.Discard))
	}
	if !sameSet(c.Subjects, w.Subjects) {
		f.Problems = append(f.Problems, fmt.Sprintf("subjects %v, flow wants %v", c.Subjects, w.Subjects))
	}
	if len(f.Problems) == 0 {
		return f, false
	}
	switch {
	case !f.Sealed && !c.DenyPurge && c.DenyDelete == w.DenyDelete:
		f.Action = "update" // NATS takes these back in an update
	case w.Recreate:
		f.Action, f.Note = "recreate", "what it holds is lost; flow rebuilds it"
	default:
		f.Action, f.Note = "refuse", w.Refuse
	}
	return f, true
}

func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

// Repair mends what Check finds, through js, which must have an admin's rights on the
// streams (a node's cannot update, delete or recreate them): a stream whose settings
// only differ is updated back; a sealed one (or one with deny flags NATS will not take
// back) is deleted and created anew if its Want allows it, refused otherwise. With
// dryRun it changes nothing and says what it would do. above is a sequence the leader
// bucket's next revision must pass (the highest term the log applied): a recreated
// KeepSequence stream continues above it and above its old last sequence.
func Repair(ctx context.Context, js jetstream.JetStream, wants []Want, dryRun bool, above uint64) ([]Finding, error) {
	var out []Finding
	var errs []error
	for _, w := range wants {
		s, err := js.Stream(ctx, w.Name)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			continue
		}
		if err != nil {
			return out, fmt.Errorf("streams: repair %s: %w", w.Name, err)
		}
		info := s.CachedInfo()
		f, ok := compare(w, info.Config)
		if !ok {
			continue
		}
		if !dryRun {
			if err := mend(ctx, js, w, &f, info, above); err != nil {
				f.Error = err.Error()
				errs = append(errs, fmt.Errorf("%s: %w", w.Name, err))
			}
		}
		out = append(out, f)
	}
	return out, errors.Join(errs...)
}

func mend(ctx context.Context, js jetstream.JetStream, w Want, f *Finding, info *jetstream.StreamInfo, above uint64) error {
	if f.Action == "update" {
		cfg := info.Config
		cfg.MaxAge, cfg.MaxBytes, cfg.Discard, cfg.Subjects, cfg.AllowRollup = w.MaxAge, w.MaxBytes, w.Discard, w.Subjects, w.AllowRollup
		if _, err := js.UpdateStream(ctx, cfg); err == nil {
			f.Done = true
			return nil
		} else if !w.Recreate {
			return fmt.Errorf("update: %w", err)
		}
		f.Action, f.Note = "recreate", "its update was refused; what it holds is lost, and flow rebuilds it"
	}
	if f.Action != "recreate" {
		return nil
	}
	if err := js.DeleteStream(ctx, w.Name); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
		return fmt.Errorf("delete: %w", err)
	}
	if err := w.Create(ctx, js); err != nil {
		return fmt.Errorf("create: %w", err)
	}
	if w.KeepSequence {
		next := max(info.State.LastSeq, above) + 1
		s, err := js.Stream(ctx, w.Name)
		if err != nil {
			return fmt.Errorf("continue its sequences: %w", err)
		}
		// A purge up to a sequence past the last one moves the next one there.
		if err := s.Purge(ctx, jetstream.WithPurgeSequence(next)); err != nil {
			return fmt.Errorf("continue its sequences above %d: %w", next-1, err)
		}
	}
	f.Done = true
	return nil
}

// jsErrStreamSealed is the JetStream API's error code for a write to a sealed stream
// ("invalid operation on sealed stream"), which nats.go names no sentinel for.
const jsErrStreamSealed = 10109

// IsSealed says whether err is JetStream's refusal of a write to a sealed stream.
func IsSealed(err error) bool {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) && apiErr.ErrorCode == jsErrStreamSealed {
		return true
	}
	return err != nil && strings.Contains(err.Error(), "invalid operation on sealed stream")
}
