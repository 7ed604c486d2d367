package logstream

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/internal/base/port"
)

// SnapshotBucket is the JetStream object store that holds the state snapshots.
const SnapshotBucket = port.SnapshotBucket

// KeepSnapshots is how many snapshots are kept: the newest, and two to fall back on.
const KeepSnapshots = 3

// snapshotPrefix names snapshot objects: the prefix and the sequence, zero-padded so
// that names sort in sequence order.
const snapshotPrefix = "state-"

// Snapshot is one stored snapshot.
type Snapshot struct {
	Name string
	Seq  uint64
	Size uint64
	At   time.Time
}

// Snapshots writes this node's state to the snapshot bucket (FLOW_SNAPSHOTS), and lists
// and prunes what the bucket holds. It runs no goroutine: nothing to start or stop. A
// node that must start from a snapshot restores one with PrepareState, before its store
// is open.
type Snapshots struct {
	objs  port.Objects // nil: none are kept
	store *checkpoint.Store
	nonce string // names this node's snapshots being written
	log   *slog.Logger
}

func newSnapshots(cfg Config, log *slog.Logger) *Snapshots {
	return &Snapshots{objs: cfg.Snapshots, store: cfg.Store, nonce: nonceOr(cfg.Nonce), log: log}
}

// List lists the stored snapshots, oldest first (none when there is no bucket yet).
func (s *Snapshots) List(ctx context.Context) ([]Snapshot, error) { return listSnapshots(ctx, s.objs) }

// listSnapshots lists the snapshots in objs, oldest first (none without a store).
func listSnapshots(ctx context.Context, objs port.Objects) ([]Snapshot, error) {
	if objs == nil {
		return nil, nil
	}
	infos, err := objs.List(ctx)
	if err != nil {
		return nil, fmt.Errorf("logstream: list snapshots: %w", err)
	}
	var out []Snapshot
	for _, in := range infos {
		seq, err := strconv.ParseUint(strings.TrimPrefix(in.Name, snapshotPrefix), 10, 64)
		if !strings.HasPrefix(in.Name, snapshotPrefix) || err != nil {
			continue // not ours, or one being written (state-part-...)
		}
		out = append(out, Snapshot{Name: in.Name, Seq: seq, Size: in.Size, At: in.Modified})
	}
	slices.SortFunc(out, func(a, b Snapshot) int { return cmpUint(a.Seq, b.Seq) })
	return out, nil
}

func cmpUint(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Take writes a snapshot of this node's state to the snapshot bucket, streamed (the
// state is read from a Pebble snapshot while applying goes on), checksummed by the
// format and by the object store; then it prunes the bucket (Prune).
func (s *Snapshots) Take(ctx context.Context) (Snapshot, error) {
	// The object store's Put publishes every chunk asynchronously through a JetStream
	// context it makes itself, whose ack timeout is the default request timeout (5 s)
	// unless ctx has a deadline; behind a busy node's synced log a chunk's ack can take
	// longer ("timeout waiting for ack" in the soak, docs/perf.md). With a deadline the
	// whole upload is bounded by it instead.
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, snapshotUploadTimeout)
		defer cancel()
	}
	obs := s.objs
	if obs == nil {
		return Snapshot{}, errors.New("logstream: this node keeps no snapshots (Config.Snapshots is nil)")
	}
	pr, pw := io.Pipe()
	metas := make(chan checkpoint.SnapshotMeta, 1)
	go func() {
		meta, err := s.store.WriteSnapshot(pw)
		pw.CloseWithError(err)
		metas <- meta
	}()
	// The object is named by its sequence, known once the snapshot is written: it is
	// written under a name of its own, then renamed; a reader never sees half of one.
	tmp := snapshotPrefix + "part-" + s.nonce + "-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	info, err := obs.Put(ctx, tmp, nil, s.uploadReader(ctx, pr))
	pr.CloseWithError(err) // a failed put unblocks the writer
	meta := <-metas
	if err != nil {
		_ = obs.Delete(context.WithoutCancel(ctx), tmp)
		return Snapshot{}, fmt.Errorf("logstream: write snapshot: %w", err)
	}
	name := snapshotPrefix + fmt.Sprintf("%020d", meta.Seq)
	if err := obs.Rename(ctx, tmp, name, map[string]string{"Flow-Seq": strconv.FormatUint(meta.Seq, 10), "Flow-Log": meta.LogIdentity}); err != nil {
		_ = obs.Delete(context.WithoutCancel(ctx), tmp)
		if errors.Is(err, port.ErrKeyExists) { // one at this sequence is there already
			return Snapshot{Name: name, Seq: meta.Seq, Size: info.Size, At: time.Now()}, nil
		}
		return Snapshot{}, fmt.Errorf("logstream: name snapshot %s: %w", name, err)
	}
	if err := prune(ctx, obs); err != nil {
		s.log.Warn("snapshot written; pruning the older ones failed (the next snapshot tries again)", "err", err)
	}
	s.log.Info("snapshot written", "seq", meta.Seq, "bytes", info.Size, "keys", meta.Keys)
	return Snapshot{Name: name, Seq: meta.Seq, Size: info.Size, At: time.Now()}, nil
}

// snapshotUploadTimeout bounds a snapshot's upload when the caller gives no deadline.
const snapshotUploadTimeout = 10 * time.Minute

// fullChunks makes every Read fill p (but the last): the object store sends one message
// per Read, and a pipe returns what each Write wrote (16 KiB from the snapshot's
// writer), so a 70 MiB snapshot became 4,500 small messages, more than a JetStream
// context lets be outstanding ("stalled with too many outstanding async published
// messages" in the soak), each one fsynced on its own.
type fullChunks struct{ r io.Reader }

func (f fullChunks) Read(p []byte) (int, error) {
	n, err := io.ReadFull(f.r, p)
	if errors.Is(err, io.ErrUnexpectedEOF) {
		err = io.EOF
	}
	return n, err
}

// haltSnapshotAfter, set at link time (-ldflags "-X .../logstream.haltSnapshotAfter=131072")
// and empty in every other build, makes a snapshot's upload stop after that many bytes,
// having logged so, until its context ends: the real-process test SIGKILLs the node in
// the middle of a snapshot write (clustertest TestCrashDuringSnapshotRestoreAndPurge).
var haltSnapshotAfter string

// uploadReader is what the object store reads a snapshot from: r in full chunks, and
// halted where a test build says.
func (s *Snapshots) uploadReader(ctx context.Context, r io.Reader) io.Reader {
	n, err := strconv.ParseInt(haltSnapshotAfter, 10, 64)
	if haltSnapshotAfter == "" || err != nil {
		return fullChunks{r}
	}
	halted := func(p []byte) (int, error) {
		s.log.Warn("snapshot upload halted for a test (haltSnapshotAfter)", "after_bytes", n)
		<-ctx.Done()
		return 0, ctx.Err()
	}
	return fullChunks{io.MultiReader(io.LimitReader(r, n), readerFunc(halted))}
}

type readerFunc func([]byte) (int, error)

func (f readerFunc) Read(p []byte) (int, error) { return f(p) }

// Prune deletes all but the newest KeepSnapshots, and parts left by writers that died
// (older than a minute). Take prunes after each snapshot it writes.
func (s *Snapshots) Prune(ctx context.Context) error {
	if s.objs == nil {
		return nil
	}
	return prune(ctx, s.objs)
}

// prune deletes all but the newest KeepSnapshots snapshots, and snapshots being written
// that were left behind (a minute old: a writer that died).
func prune(ctx context.Context, obs port.Objects) error {
	snaps, err := listSnapshots(ctx, obs)
	if err != nil {
		return err
	}
	var first error
	keep := func(err error) {
		if first == nil && err != nil {
			first = fmt.Errorf("logstream: prune snapshots: %w", err)
		}
	}
	for i := 0; i < len(snaps)-KeepSnapshots; i++ {
		keep(obs.Delete(ctx, snaps[i].Name))
	}
	infos, err := obs.List(ctx)
	keep(err)
	for _, in := range infos {
		if strings.HasPrefix(in.Name, snapshotPrefix+"part-") && time.Since(in.Modified) > time.Minute {
			keep(obs.Delete(ctx, in.Name))
		}
	}
	return first
}

// PrepareState restores the newest snapshot into stateDir when this node cannot start
// from the state it has: there is none (a new node joining a log that no longer starts
// at 1), or it is behind the log's first sequence. A state that is behind is moved aside
// (stateDir.replaced-<unix time>), never deleted. It does nothing when the state can
// continue from the log, when the log is missing, or when no snapshot bridges the gap
// (the log's checks then refuse the node and say why).
func PrepareState(ctx context.Context, src port.Stream, objs port.Objects, stateDir string, log *slog.Logger) error {
	info, err := src.Info(ctx)
	if errors.Is(err, port.ErrNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("logstream: stream %s: %w", src.Name(), err)
	}
	first := info.FirstSeq
	var applied uint64
	_, statErr := os.Stat(stateDir)
	if statErr == nil {
		st, err := checkpoint.OpenStore(stateDir, checkpoint.StoreOptions{})
		if err != nil {
			return err
		}
		applied = st.Applied()
		if err := st.Close(); err != nil {
			return err
		}
	}
	if first <= applied+1 {
		return nil // the log holds every message after the applied one
	}
	snaps, err := listSnapshots(ctx, objs)
	if err != nil {
		return err
	}
	if len(snaps) == 0 {
		return nil
	}
	newest := snaps[len(snaps)-1]
	if newest.Seq+1 < first || newest.Seq <= applied {
		return nil // it does not bridge the gap, or is no newer than the state
	}
	r, oi, err := objs.Get(ctx, newest.Name)
	if err != nil {
		return fmt.Errorf("logstream: read snapshot %s: %w", newest.Name, err)
	}
	defer r.Close()
	if have, want := oi.Headers["Flow-Log"], Identity(src.Name(), info.Created); have != "" && have != want {
		return nil // a snapshot of another log (the stream was recreated): the log's checks say so
	}
	if statErr == nil {
		aside := fmt.Sprintf("%s.replaced-%d", stateDir, time.Now().Unix())
		if err := os.Rename(stateDir, aside); err != nil {
			return fmt.Errorf("logstream: move the state behind the log aside: %w", err)
		}
		log.Warn("this node's state is behind the log's first sequence: moved aside, restoring the newest snapshot", "applied", applied, "first_seq", first, "moved_to", aside)
	}
	began := time.Now()
	meta, err := checkpoint.RestoreSnapshot(stateDir, r, nil)
	if err != nil {
		return fmt.Errorf("logstream: restore snapshot %s: %w", newest.Name, err)
	}
	log.Info("restored the newest snapshot", "seq", meta.Seq, "keys", meta.Keys, "took", time.Since(began))
	return nil
}
