package checkpoint

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strconv"

	"github.com/fxamacker/cbor/v2"
)

// How a log message is encoded. A log format is a cluster version (docs/operations.md,
// "Upgrading"): writers use the format of the cluster version their node has applied,
// and the leader raises the version only when every node of the cluster reads the new
// format. Every format stays readable for good (old logs, snapshots' tails).
//
//   - Format 1: JSON, {"v": revision, "node": ..., "entries": [...]}, each entry in
//     Entry's json names. A message is written at the lowest revision that holds its
//     entries (RevisionOf). The format of every release before the cluster version.
//   - Format 2: CBOR (RFC 8949, github.com/fxamacker/cbor), an array [2, revision,
//     node, [entries...]], each entry a map keyed by the same names. Outputs and
//     inputs, which are JSON, ride as byte strings, neither escaped nor re-parsed.
//     docs/decisions.md has the measurements it was chosen by.
//   - Format 3: format 2's encoding (the array says 3), whose messages may hold
//     revision 5's entries: the fourth round's flow control (a run started by a
//     message, trigger "event"). An entry a format does not hold is refused at the
//     writer (ErrInvalidEntry: the cluster version is too low) and is corruption to a
//     reader, so no node ever applies what an older member of the cluster would stop at.
const (
	LogFormatJSON        = 1
	LogFormatBinary      = 2
	LogFormatFlowControl = 3
	// NewestLogFormat is the newest log format this code writes.
	NewestLogFormat = LogFormatFlowControl
)

// MaxRevision is the newest revision of entries a message of format may hold: format
// 1 and 2 up to 4 (what the releases before format 3 read), format 3 up to Revision.
func MaxRevision(format int) int {
	if format < LogFormatFlowControl {
		return 4
	}
	return Revision
}

// readFormatsLinked, set at link time (-X
// github.com/flowrun/flow/checkpoint.readFormatsLinked=1), makes this binary read, and
// say it reads, log formats up to that number only, and format 1 up to revision 3: the
// release before the cluster version, for the rolling-upgrade tests
// (internal/testkit/clustertest/upgrade_test.go).
var readFormatsLinked string

// reader is what a reader of the log reads: formats up to format, entries up to
// revision.
type reader struct{ format, revision int }

// thisBinary is what this binary reads.
var thisBinary = func() reader {
	if n, err := strconv.Atoi(readFormatsLinked); err == nil && n >= 1 && n < NewestLogFormat {
		return readerOf(n)
	}
	return readerOf(NewestLogFormat)
}()

// readerOf is the reader of the release that read up to format: format 1's readers
// before the cluster version read revisions up to 3.
func readerOf(format int) reader {
	if format < LogFormatBinary {
		return reader{format, 3}
	}
	return reader{format, MaxRevision(format)}
}

// MaxReadFormat is the newest log format this binary reads.
func MaxReadFormat() int { return thisBinary.format }

// ReadFormats are the log formats this binary reads: 1 to MaxReadFormat.
func ReadFormats() []int {
	out := make([]int, thisBinary.format)
	for i := range out {
		out[i] = i + 1
	}
	return out
}

// Message is a decoded log message.
type Message struct {
	Format   int     // LogFormatJSON or LogFormatBinary
	Revision int     // the newest revision its entries may need
	Node     string  // the node that wrote it, if it says
	Entries  []Entry // never empty
}

// DecodeMessage decodes a message of any format strictly: unknown fields or kinds are
// corruption (*CorruptError), since they mean a writer this code does not understand;
// a newer format or revision is ErrNewerFormat ("upgrade flowd").
func DecodeMessage(seq uint64, data []byte) (Message, error) {
	return thisBinary.decode(seq, data)
}

func (rd reader) decode(seq uint64, data []byte) (Message, error) {
	if len(data) > 0 && data[0] == '{' {
		return rd.decodeJSON(seq, data)
	}
	return rd.decodeBinary(seq, data)
}

// DecodeEnvelope is DecodeMessage's entries.
func DecodeEnvelope(seq uint64, data []byte) ([]Entry, error) {
	m, err := DecodeMessage(seq, data)
	return m.Entries, err
}

// binaryEnvelope is a format-2 message: a CBOR array.
type binaryEnvelope struct {
	_        struct{} `cbor:",toarray"`
	Format   int
	Revision int
	Node     string
	Entries  []Entry
}

// binaryEnvelopeRaw is a format-2 message built from entries already encoded.
type binaryEnvelopeRaw struct {
	_        struct{} `cbor:",toarray"`
	Format   int
	Revision int
	Node     string
	Entries  []cbor.RawMessage
}

var (
	cborEnc = func() cbor.EncMode {
		m, err := cbor.EncOptions{
			Time:          cbor.TimeRFC3339Nano, // exact, and what format 1 records
			ShortestFloat: cbor.ShortestFloatNone,
		}.EncMode()
		if err != nil {
			panic(err)
		}
		return m
	}()
	cborDec = func() cbor.DecMode {
		m, err := cbor.DecOptions{
			DupMapKey:         cbor.DupMapKeyEnforcedAPF,
			ExtraReturnErrors: cbor.ExtraDecErrorUnknownField,
			FieldNameMatching: cbor.FieldNameMatchingCaseSensitive,
			IndefLength:       cbor.IndefLengthForbidden,
			TagsMd:            cbor.TagsForbidden,
			UTF8:              cbor.UTF8RejectInvalid,
			DefaultMapType:    reflect.TypeOf(map[string]any(nil)),
		}.DecMode()
		if err != nil {
			panic(err)
		}
		return m
	}()
)

// decodeBinary decodes a format-2 message. Its first two bytes say the array and the
// format (an array of four, a small unsigned integer), so a newer format is known
// before its entries are read.
func (rd reader) decodeBinary(seq uint64, data []byte) (Message, error) {
	if len(data) < 3 || data[0] != 0x84 || data[1] > 0x17 || data[2] > 0x17 {
		return Message{}, &CorruptError{Seq: seq, Detail: "decode: neither a format-1 (JSON) nor a format-2 (CBOR) message"}
	}
	f, rev := int(data[1]), int(data[2])
	if f > rd.format || f >= LogFormatBinary && rev > rd.revision && rev <= MaxRevision(f) {
		return Message{}, fmt.Errorf("%w: the message at sequence %d has log format %d revision %d, this flowd reads formats up to %d (revisions up to %d)", ErrNewerFormat, seq, f, rev, rd.format, rd.revision)
	} else if f < LogFormatBinary {
		return Message{}, &CorruptError{Seq: seq, Detail: fmt.Sprintf("format %d in a CBOR message", f)}
	} else if rev > MaxRevision(f) {
		// No writer puts a newer revision in an older format (the writer refuses it):
		// an older member would stop at it, so every node must skip it alike.
		return Message{}, &CorruptError{Seq: seq, Detail: fmt.Sprintf("revision %d in a format-%d message, which holds revisions up to %d", rev, f, MaxRevision(f))}
	}
	var env binaryEnvelope
	if err := cborDec.Unmarshal(data, &env); err != nil {
		return Message{}, &CorruptError{Seq: seq, Detail: "decode: " + err.Error()}
	}
	if env.Revision < 1 {
		return Message{}, &CorruptError{Seq: seq, Detail: fmt.Sprintf("revision %d", env.Revision)}
	}
	m := Message{Format: f, Revision: env.Revision, Node: env.Node, Entries: env.Entries}
	if err := m.check(seq); err != nil {
		return Message{}, err
	}
	return m, nil
}

// EncodeEntry encodes one entry in a log format, for EncodeEnvelopeIn.
func EncodeEntry(format int, e *Entry) ([]byte, error) {
	var raw []byte
	var err error
	if format >= LogFormatBinary {
		raw, err = cborEnc.Marshal(e)
	} else {
		raw, err = json.Marshal(e)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: encode: %v", ErrInvalidEntry, err)
	}
	return raw, nil
}

// EncodeEnvelopeIn joins entries EncodeEntry encoded in format into one message
// without re-encoding them. revision is the highest RevisionOf of the entries (format
// 1) or MaxRevision(format) (formats 2 and 3).
func EncodeEnvelopeIn(format int, node string, revision int, entries [][]byte) []byte {
	if format < LogFormatBinary {
		return EncodeJSONEnvelope(node, revision, entries)
	}
	raws := make([]cbor.RawMessage, len(entries))
	for i, e := range entries {
		raws[i] = e
	}
	b, err := cborEnc.Marshal(binaryEnvelopeRaw{Format: min(format, NewestLogFormat), Revision: revision, Node: node, Entries: raws})
	if err != nil { // raw messages EncodeEntry made, a string and two small integers
		panic(fmt.Sprintf("checkpoint: encode a format-2 envelope: %v", err))
	}
	return b
}

// EncodeMessageIn encodes entries as one log message in a log format (format 1: at the
// lowest revision that holds them all).
func EncodeMessageIn(format int, node string, entries ...Entry) ([]byte, error) {
	revision := MaxRevision(format)
	if format < LogFormatBinary {
		revision = 1
	}
	datas := make([][]byte, len(entries))
	for i := range entries {
		raw, err := EncodeEntry(format, &entries[i])
		if err != nil {
			return nil, err
		}
		datas[i] = raw
		if format < LogFormatBinary {
			revision = max(revision, RevisionOf(&entries[i]))
		}
		if RevisionOf(&entries[i]) > MaxRevision(format) {
			return nil, fmt.Errorf("%w: %s", ErrInvalidEntry, NeedsFormat(&entries[i], format))
		}
	}
	return EncodeEnvelopeIn(format, node, revision, datas), nil
}

// NeedsFormat says why entry e cannot be written in format: which entry needs which
// cluster version, and what raises it.
func NeedsFormat(e *Entry, format int) string {
	what := fmt.Sprintf("a %s entry of revision %d", e.Kind, RevisionOf(e))
	switch {
	case e.Submit != nil && e.Submit.Trigger == TriggerEvent:
		what = "a run started by a message (trigger event)"
	case e.Submit != nil && e.Submit.Priority != 0:
		what = fmt.Sprintf("a run of priority %d", e.Submit.Priority)
	case e.Submit != nil && e.Submit.KeyScheme != 0:
		what = "a run whose http keys cover their requests (key_scheme 2)"
	}
	return fmt.Sprintf("%s needs cluster version %d, the cluster is at %d: the leader raises it once every node runs a release that reads log format %d (flowctl cluster status)",
		what, LogFormatFlowControl, format, LogFormatFlowControl)
}
