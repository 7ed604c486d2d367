package checkpoint

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"strconv"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// snapshotBuffer is how much of a snapshot is written at once: small enough that a
// snapshot streams (the object store takes it in chunks), large enough to batch.
const snapshotBuffer = 16 << 10

// SnapshotFormat is the version of the snapshot format this code writes and reads.
const SnapshotFormat = 1

// snapshotMagic opens every snapshot, so that another file is refused at once.
const snapshotMagic = "flow-state-snapshot\n"

// SnapshotMeta describes a snapshot: the state as it was after applying the log up to
// Seq, built from the log named LogIdentity.
type SnapshotMeta struct {
	Format      int    `json:"format"`
	Seq         uint64 `json:"seq"`
	LogIdentity string `json:"log"`
	Keys        int    `json:"keys,omitempty"` // in the trailer: how many records
}

// ErrBadSnapshot: a snapshot that is not one, is truncated, fails its checksum, or has a
// newer format than this code reads. Nothing is restored from it.
var ErrBadSnapshot = errors.New("checkpoint: bad snapshot")

// WriteSnapshot writes the whole state, as of one moment, to w: a header (format, the
// applied sequence, the log identity), every key and value, and a trailer with the
// record count and a SHA-256 of everything before it. Applying goes on while it writes:
// it reads a Pebble snapshot taken when it starts.
func (s *Store) WriteSnapshot(w io.Writer) (SnapshotMeta, error) {
	snap := s.db.NewSnapshot()
	defer snap.Close()
	meta := SnapshotMeta{Format: SnapshotFormat}
	raw, closer, err := snap.Get(keyApplied)
	switch {
	case errors.Is(err, pebble.ErrNotFound):
	case err != nil:
		return meta, fmt.Errorf("checkpoint: snapshot: %w: %w", ErrStorage, err)
	default:
		if len(raw) == 8 {
			meta.Seq = binary.BigEndian.Uint64(raw)
		}
		closer.Close()
	}
	switch v, closer, err := snap.Get(keyLogIdentity); {
	case err == nil:
		meta.LogIdentity = string(v)
		closer.Close()
	case !errors.Is(err, pebble.ErrNotFound):
		return meta, fmt.Errorf("checkpoint: snapshot: read the log identity: %w: %w", ErrStorage, err)
	}
	sum := sha256.New()
	bw := bufio.NewWriterSize(io.MultiWriter(w, sum), snapshotBuffer)
	head, _ := json.Marshal(meta)
	if _, err := fmt.Fprintf(bw, "%s%s\n", snapshotMagic, head); err != nil {
		return meta, fmt.Errorf("checkpoint: snapshot: %w", err)
	}
	var lens [2 * binary.MaxVarintLen64]byte
	err = scan(snap, nil, nil, func(k, v []byte) (bool, error) {
		n := binary.PutUvarint(lens[:], uint64(len(k)))
		n += binary.PutUvarint(lens[n:], uint64(len(v)))
		if _, err := bw.Write(lens[:n]); err != nil {
			return false, err
		}
		if _, err := bw.Write(k); err != nil {
			return false, err
		}
		_, err := bw.Write(v)
		meta.Keys++
		return err == nil, err
	})
	if err != nil {
		return meta, fmt.Errorf("checkpoint: snapshot: %w", err)
	}
	// The end: a zero-length key (no real key is empty), then the trailer and the sum.
	bw.WriteByte(0)
	trailer, _ := json.Marshal(meta)
	fmt.Fprintf(bw, "%s\n", trailer)
	if err := bw.Flush(); err != nil {
		return meta, fmt.Errorf("checkpoint: snapshot: %w", err)
	}
	if _, err := w.Write(sum.Sum(nil)); err != nil {
		return meta, fmt.Errorf("checkpoint: snapshot: %w", err)
	}
	return meta, nil
}

// RestoreSnapshot builds the state in dir from a snapshot read from r, and returns its
// meta. dir must not hold a state. The state is built in dir+".restoring" and renamed to
// dir only once the snapshot's checksum is verified: a crash during a restore leaves dir
// without a state (the next restore starts over), never with a partial one. fs nil is
// the real disk.
func RestoreSnapshot(dir string, r io.Reader, fs vfs.FS) (SnapshotMeta, error) {
	if fs == nil {
		fs = vfs.Default
	}
	var meta SnapshotMeta
	if _, err := fs.Stat(dir); err == nil {
		return meta, fmt.Errorf("checkpoint: restore into %s: it already holds a state; move it aside first", dir)
	}
	tmp := dir + ".restoring"
	if err := fs.RemoveAll(tmp); err != nil {
		return meta, fmt.Errorf("checkpoint: restore: clear %s: %w", tmp, err)
	}
	s, err := OpenStore(tmp, StoreOptions{FS: fs})
	if err != nil {
		return meta, err
	}
	if haltRestoreAfter != "" {
		r = haltingReader(r, haltRestoreAfter)
	}
	meta, err = readSnapshot(s.db, r)
	if cerr := s.Close(); err == nil && cerr != nil {
		err = cerr
	}
	if err != nil {
		_ = fs.RemoveAll(tmp)
		return meta, err
	}
	if err := fs.Rename(tmp, dir); err != nil {
		return meta, fmt.Errorf("checkpoint: restore: %w", err)
	}
	return meta, nil
}

// haltRestoreAfter, set at link time (-ldflags "-X .../checkpoint.haltRestoreAfter=65536")
// and empty in every other build, makes a restore stop for good after reading that many
// bytes, having said so on stderr: the real-process test SIGKILLs the node there
// (clustertest TestCrashDuringSnapshotRestoreAndPurge).
var haltRestoreAfter string

// haltingReader reads through r until after bytes (a decimal string), then says so and
// blocks until the process is killed.
func haltingReader(r io.Reader, after string) io.Reader {
	n, err := strconv.ParseInt(after, 10, 64)
	if err != nil {
		return r
	}
	return io.MultiReader(io.LimitReader(r, n), readerFunc(func([]byte) (int, error) {
		fmt.Fprintln(os.Stderr, "checkpoint: restore halted for a test (haltRestoreAfter)")
		select {} // the test SIGKILLs this process
	}))
}

type readerFunc func([]byte) (int, error)

func (f readerFunc) Read(p []byte) (int, error) { return f(p) }

// readSnapshot writes the snapshot's records into db, verifying it as it goes.
func readSnapshot(db *pebble.DB, r io.Reader) (SnapshotMeta, error) {
	var meta SnapshotMeta
	bad := func(format string, args ...any) (SnapshotMeta, error) {
		return meta, fmt.Errorf("%w: %s", ErrBadSnapshot, fmt.Sprintf(format, args...))
	}
	sum := sha256.New()
	br := bufio.NewReaderSize(r, 256<<10)
	in := &hashingReader{r: br, h: sum}
	magic := make([]byte, len(snapshotMagic))
	if _, err := io.ReadFull(in, magic); err != nil || string(magic) != snapshotMagic {
		return bad("not a flow state snapshot")
	}
	head, err := in.readLine()
	if err != nil || json.Unmarshal(head, &meta) != nil {
		return bad("its header does not decode")
	}
	if meta.Format != SnapshotFormat {
		return bad("format %d, this flowd reads format %d (upgrade flowd)", meta.Format, SnapshotFormat)
	}
	b := db.NewBatch()
	keys := 0
	for {
		klen, err := binary.ReadUvarint(in)
		if err != nil {
			b.Close()
			return bad("truncated after %d records", keys)
		}
		if klen == 0 {
			break
		}
		vlen, err := binary.ReadUvarint(in)
		if err != nil || klen > 1<<20 || vlen > 64<<20 {
			b.Close()
			return bad("record %d is malformed", keys)
		}
		kv := make([]byte, klen+vlen)
		if _, err := io.ReadFull(in, kv); err != nil {
			b.Close()
			return bad("truncated in record %d", keys)
		}
		_ = b.Set(kv[:klen], kv[klen:], nil)
		keys++
		if b.Len() > 4<<20 {
			if err := b.Commit(pebble.NoSync); err != nil {
				return meta, fmt.Errorf("checkpoint: restore: %w: %w", ErrStorage, err)
			}
			b = db.NewBatch()
		}
	}
	if err := b.Commit(pebble.Sync); err != nil {
		return meta, fmt.Errorf("checkpoint: restore: %w: %w", ErrStorage, err)
	}
	trailerLine, err := in.readLine()
	var trailer SnapshotMeta
	if err != nil || json.Unmarshal(trailerLine, &trailer) != nil {
		return bad("truncated: no trailer")
	}
	want := sum.Sum(nil)
	got := make([]byte, len(want))
	if _, err := io.ReadFull(br, got); err != nil || !bytes.Equal(got, want) {
		return bad("its checksum does not match: the snapshot is corrupt")
	}
	if trailer.Keys != keys || trailer.Seq != meta.Seq {
		return bad("its trailer says %d records at sequence %d, it holds %d at %d", trailer.Keys, trailer.Seq, keys, meta.Seq)
	}
	meta.Keys = keys
	return meta, nil
}

// hashingReader hashes what it reads.
type hashingReader struct {
	r *bufio.Reader
	h hash.Hash
}

func (h *hashingReader) Read(p []byte) (int, error) {
	n, err := h.r.Read(p)
	h.h.Write(p[:n])
	return n, err
}

func (h *hashingReader) ReadByte() (byte, error) {
	c, err := h.r.ReadByte()
	if err == nil {
		h.h.Write([]byte{c})
	}
	return c, err
}

// readLine reads up to a newline (at most 64 KiB), without it.
func (h *hashingReader) readLine() ([]byte, error) {
	var line []byte
	for len(line) < 64<<10 {
		c, err := h.ReadByte()
		if err != nil {
			return nil, err
		}
		if c == '\n' {
			return line, nil
		}
		line = append(line, c)
	}
	return nil, errors.New("line too long")
}
