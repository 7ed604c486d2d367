package checkpoint

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"
)

// The log format's candidates, measured on the entries a run writes (docs/decisions.md,
// "Log format 2"): CPU to encode and to decode an entry, and its bytes. Format 2 is
// the CBOR one; msgpack (github.com/vmihailenco/msgpack) was the other candidate and is
// measured here so that the choice can be made again.

// benchEntries are the entries of a payout-like run: its submit, an assign and a claim,
// and for each of 16 items a start and a commit with a small output, then the
// completion.
func benchEntries() []Entry {
	at := time.Date(2026, 12, 3, 2, 0, 0, 123456789, time.UTC)
	spec := json.RawMessage(`{"name":"payout","steps":[{"name":"transfer","uses":"http","foreach":"{{ steps.drivers.output }}","with":{"url":"http://wallet/pay","method":"POST"}}]}`)
	es := []Entry{
		{Kind: KindSubmit, Run: "payout-20261203T020000Z", Actor: "cron", At: at, Submit: &Submit{Workflow: "payout", Version: 3, Trigger: TriggerCron,
			ScheduledAt: at, MaxEpochs: 5, Inputs: json.RawMessage(`{"date":"2026-12-03"}`), Spec: spec,
			Steps: []StepSpec{{Name: "drivers"}, {Name: "transfer", Foreach: true}}}},
		{Kind: KindAssign, Run: "payout-20261203T020000Z", Term: 7, Worker: "node-a", At: at},
		{Kind: KindClaim, Run: "payout-20261203T020000Z", Epoch: 1234, Owner: "node-a", At: at},
	}
	for i := range 16 {
		es = append(es,
			Entry{Kind: KindStart, Run: "payout-20261203T020000Z", Step: "transfer", Item: i, Epoch: 1234, Owner: "node-a", Attempt: 1, At: at},
			Entry{Kind: KindCommit, Run: "payout-20261203T020000Z", Step: "transfer", Item: i, Epoch: 1234, Owner: "node-a",
				Output: json.RawMessage(fmt.Sprintf(`{"driver":"d-%06d","cents":123456,"status":"paid"}`, i)), At: at})
	}
	return append(es, Entry{Kind: KindComplete, Run: "payout-20261203T020000Z", Epoch: 1234, Owner: "node-a", Status: StatusSucceeded, At: at})
}

type codec struct {
	name   string
	encode func(*Entry) ([]byte, error)
	decode func([]byte, *Entry) error
}

func codecs() []codec {
	// msgpack's pooled encoders and decoders, set up as flow would use them: Entry's
	// json names, empty fields left out, unknown fields refused.
	strictMsgpack := func(b []byte, e *Entry) error {
		d := msgpack.GetDecoder()
		defer msgpack.PutDecoder(d)
		d.Reset(bytes.NewReader(b))
		d.SetCustomStructTag("json")
		d.DisallowUnknownFields(true)
		return d.Decode(e)
	}
	return []codec{
		{"json", func(e *Entry) ([]byte, error) { return json.Marshal(e) }, func(b []byte, e *Entry) error {
			d := json.NewDecoder(bytes.NewReader(b))
			d.DisallowUnknownFields()
			return d.Decode(e)
		}},
		{"cbor", func(e *Entry) ([]byte, error) { return cborEnc.Marshal(e) }, func(b []byte, e *Entry) error { return cborDec.Unmarshal(b, e) }},
		{"msgpack", func(e *Entry) ([]byte, error) {
			var buf bytes.Buffer
			enc := msgpack.GetEncoder()
			defer msgpack.PutEncoder(enc)
			enc.Reset(&buf)
			enc.SetCustomStructTag("json")
			enc.SetOmitEmpty(true)
			err := enc.Encode(e)
			return buf.Bytes(), err
		}, strictMsgpack},
	}
}

// TestCodecCandidatesRoundTrip: every candidate gives back the entries it was given
// (times to the nanosecond, outputs byte for byte), so that the benchmark compares
// codecs that would do.
func TestCodecCandidatesRoundTrip(t *testing.T) {
	for _, c := range codecs() {
		for _, e := range benchEntries() {
			b, err := c.encode(&e)
			if err != nil {
				t.Fatalf("%s: encode %s: %v", c.name, e.Kind, err)
			}
			var back Entry
			if err := c.decode(b, &back); err != nil {
				t.Fatalf("%s: decode %s: %v", c.name, e.Kind, err)
			}
			want, _ := json.Marshal(&e)
			got, _ := json.Marshal(&back)
			if !bytes.Equal(want, got) || !back.At.Equal(e.At) {
				t.Fatalf("%s: %s came back as\n%s\nwant\n%s", c.name, e.Kind, got, want)
			}
		}
	}
}

// BenchmarkEntryCodec: ns/op is per entry; B/entry is the encoded size.
func BenchmarkEntryCodec(b *testing.B) {
	es := benchEntries()
	for _, c := range codecs() {
		b.Run("encode/"+c.name, func(b *testing.B) {
			size := 0
			for i := 0; b.Loop(); i++ {
				raw, err := c.encode(&es[i%len(es)])
				if err != nil {
					b.Fatal(err)
				}
				size += len(raw)
			}
			b.ReportMetric(float64(size)/float64(b.N), "B/entry")
		})
		raws := make([][]byte, len(es))
		for i := range es {
			raws[i], _ = c.encode(&es[i])
		}
		b.Run("decode/"+c.name, func(b *testing.B) {
			for i := 0; b.Loop(); i++ {
				var e Entry
				if err := c.decode(raws[i%len(raws)], &e); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// benchApply is BenchmarkApply in one log format.
func benchApply(b *testing.B, format int) {
	s := memStore(b, nil)
	mustApply(b, s, submitEntry("bench", StepSpec{Name: "each", Foreach: true}))
	epoch := int64(mustApply(b, s, Entry{Kind: KindAssign, Run: "bench", Term: 1, At: t0}))
	mustApply(b, s, Entry{Kind: KindClaim, Run: "bench", Epoch: epoch, Owner: "w", At: t0})
	out := json.RawMessage(`{"driver":"d-000123","cents":123456}`)
	per := 16
	if os.Getenv("APPLY_PER") == "1" {
		per = 1
	}
	msgs := make([][]byte, 0, b.N/per+1)
	for i := 0; i < b.N; i += per {
		var es []Entry
		for j := i; j < min(i+per, b.N); j++ {
			es = append(es, Entry{Kind: KindCommit, Run: "bench", Step: "each", Item: j, Epoch: epoch, Owner: "w", Output: out, At: t0})
		}
		m, err := EncodeMessageIn(format, "test", es...)
		if err != nil {
			b.Fatal(err)
		}
		msgs = append(msgs, m)
	}
	b.ResetTimer()
	for _, m := range msgs {
		if _, err := s.Apply(s.Applied()+1, m); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "commits/s")
}
