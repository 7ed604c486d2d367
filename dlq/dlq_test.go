package dlq

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/flowrun/flow/internal/base/jsport"
	"github.com/flowrun/flow/internal/base/natsnode"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// startJS starts an embedded NATS server (in process, JetStream in a temp dir) and
// returns a JetStream context on it.
func startJS(t *testing.T) jetstream.JetStream {
	t.Helper()
	srv, err := natsnode.Start(natsnode.Config{DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	nc, err := srv.Connect()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// Open creates the FLOW_DLQ stream as alerting relies on it: on disk, kept by limits
// (a subscriber reading a notice does not remove it), every flow.dlq.<run> subject, a
// 24 h de-duplication window (the leader publishes again at every reconcile) and 30
// days of age. Opening again keeps the stream and its messages.
func TestOpenCreatesTheStream(t *testing.T) {
	js := startJS(t)
	ctx := ctxT(t)
	if err := open(ctx, js, 0); err != nil {
		t.Fatal(err)
	}
	st, err := js.Stream(ctx, Stream)
	if err != nil {
		t.Fatal(err)
	}
	cfg := st.CachedInfo().Config
	if cfg.Retention != jetstream.LimitsPolicy {
		t.Errorf("retention %s, want limits", cfg.Retention)
	}
	if cfg.Storage != jetstream.FileStorage {
		t.Errorf("storage %s, want file", cfg.Storage)
	}
	if len(cfg.Subjects) != 1 || cfg.Subjects[0] != "flow.dlq.>" {
		t.Errorf("subjects %v, want [flow.dlq.>]", cfg.Subjects)
	}
	if cfg.Duplicates != 24*time.Hour {
		t.Errorf("duplicates window %s, want 24h", cfg.Duplicates)
	}
	if cfg.MaxAge != 30*24*time.Hour {
		t.Errorf("max age %s, want 720h", cfg.MaxAge)
	}
	if cfg.Replicas != 1 {
		t.Errorf("replicas %d, want 1 (asked for 0: at least one)", cfg.Replicas)
	}
	if err := Publish(ctx, jsport.PublisherOf(js), Message{Run: "r1", Epoch: 3}); err != nil {
		t.Fatal(err)
	}
	if err := open(ctx, js, 1); err != nil {
		t.Fatalf("Open on an existing stream: %v", err)
	}
	if info, err := st.Info(ctx); err != nil || info.State.Msgs != 1 {
		t.Fatalf("after a second Open: %v, %+v", err, info)
	}
}

// A notice is identified by its run and epoch: publishing it again (the leader does at
// every reconcile pass) stores nothing more, while another epoch of the run (dead-lettered
// again after a retry) or another run is a notice of its own. The stored notice is the
// message, on flow.dlq.<run>.
func TestPublishDeduplicatesByRunAndEpoch(t *testing.T) {
	js := startJS(t)
	ctx := ctxT(t)
	if err := open(ctx, js, 1); err != nil {
		t.Fatal(err)
	}
	st, err := js.Stream(ctx, Stream)
	if err != nil {
		t.Fatal(err)
	}
	msgs := func() uint64 {
		t.Helper()
		info, err := st.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return info.State.Msgs
	}
	m := Message{Run: "pay-1", Workflow: "payout", Epoch: 41, EpochChanges: 6, MaxEpochs: 5, Reason: "max_epochs exceeded",
		LastOwner: "node-b", At: "2026-11-29T02:00:00Z"}
	for i := 0; i < 3; i++ {
		if err := Publish(ctx, jsport.PublisherOf(js), m); err != nil {
			t.Fatal(err)
		}
	}
	if n := msgs(); n != 1 {
		t.Fatalf("the same notice published 3 times: %d messages stored, want 1", n)
	}
	// Another field changing (a later reconcile's At) does not make it another notice.
	later := m
	later.At = "2026-11-29T02:00:05Z"
	if err := Publish(ctx, jsport.PublisherOf(js), later); err != nil {
		t.Fatal(err)
	}
	if n := msgs(); n != 1 {
		t.Fatalf("the notice published again with a later time: %d messages, want 1", n)
	}
	raw, err := st.GetLastMsgForSubject(ctx, SubjectPrefix+"pay-1")
	if err != nil {
		t.Fatal(err)
	}
	var got Message
	if err := json.Unmarshal(raw.Data, &got); err != nil || got != m {
		t.Fatalf("stored notice %+v (%v), want the first one %+v", got, err, m)
	}
	again := m
	again.Epoch = 57
	if err := Publish(ctx, jsport.PublisherOf(js), again); err != nil {
		t.Fatal(err)
	}
	other := m
	other.Run = "pay-2"
	if err := Publish(ctx, jsport.PublisherOf(js), other); err != nil {
		t.Fatal(err)
	}
	if n := msgs(); n != 3 {
		t.Fatalf("a new epoch of the run and another run: %d messages, want 3", n)
	}
}

// open creates the stream as a node does (jsport.Open).
func open(ctx context.Context, js jetstream.JetStream, replicas int) error {
	_, err := jsport.EnsureStream(ctx, js, jsport.DLQConfig(replicas))
	return err
}
