package cli

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowrun/flow/client"
)

// cluster repair on streams as flow wants them says so; one it may not recreate (the
// DLQ stream, sealed) is refused: exit 1, saying which and why, on a dry run too in the
// table (but exit 0: nothing was asked to be done); -o json is the wire's answer.
func TestClusterRepair(t *testing.T) {
	e := startFlowd(t)
	code, out, errOut := e.flowctl("cluster", "repair", "--dry-run")
	if code != 0 || !strings.Contains(out, "every stream and bucket of flow's is as flow wants it (checked by node-a)") {
		t.Fatalf("dry run on a sound cluster: %d %q %q", code, out, errOut)
	}
	nc, err := nats.Connect(e.server) // without --auth: anyone on loopback, as an admin
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, "FLOW_DLQ")
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	cfg.Sealed = true
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	code, out, _ = e.flowctl("cluster", "repair", "--dry-run")
	if code != 0 || !strings.Contains(out, "FLOW_DLQ") || !strings.Contains(out, "refuse") || !strings.Contains(out, "dry run") {
		t.Fatalf("dry run with a sealed DLQ stream: %d %q", code, out)
	}
	code, out, errOut = e.flowctl("cluster", "repair", "-o", "json")
	var r client.Repair
	if code != 1 || json.Unmarshal([]byte(out), &r) != nil || len(r.Streams) != 1 || r.Streams[0].Action != "refuse" || !r.Streams[0].Sealed ||
		!strings.Contains(errOut, "FLOW_DLQ cannot be repaired in place") {
		t.Fatalf("repair of a sealed DLQ stream: %d %q %q", code, out, errOut)
	}
}
