package logstream

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/internal/base/jsport"
	"github.com/flowrun/flow/internal/base/natsnode"
	"github.com/flowrun/flow/internal/base/port"
)

// The output limit is fitted to a server whose max_payload cannot hold it (a stock
// nats-server's 1 MiB), and a server too small for any useful output is refused with
// the fix in the message. Nothing is created on a refused server.
func TestOutputLimitFitsTheServer(t *testing.T) {
	for _, c := range []struct {
		payload int32
		fit     int
		refused string
	}{
		{payload: 1 << 20, fit: 1<<20 - 2*envelopeHeadroom},
		{payload: 8 << 20, fit: DefaultMaxOutputBytes},
		{payload: 10 << 10, refused: "raise max_payload"},
	} {
		dir := t.TempDir()
		srv, err := natsnode.Start(natsnode.Config{DataDir: filepath.Join(dir, "nats"), MaxPayload: c.payload, NoSync: true})
		if err != nil {
			t.Fatal(err)
		}
		nc, err := srv.Connect()
		if err != nil {
			t.Fatal(err)
		}
		js, _ := jetstream.New(nc)
		// The log as a reader names it: Open creates nothing (jsport.Open creates the
		// streams of a node).
		l, err := Open(testConfigOn(jsport.StreamOf(js, port.LogStream, port.LogSubject), memStore(t), "node-a"))
		switch {
		case c.refused != "":
			if !errors.Is(err, checkpoint.ErrInvalidEntry) || !strings.Contains(err.Error(), c.refused) {
				t.Errorf("max_payload %d: %v, want a refusal saying %q", c.payload, err, c.refused)
			}
			if _, serr := js.Stream(ctxT(t), DefaultStream); !errors.Is(serr, jetstream.ErrStreamNotFound) {
				t.Errorf("max_payload %d: the refused start created the stream (%v)", c.payload, serr)
			}
		case err != nil:
			t.Errorf("max_payload %d: %v", c.payload, err)
		case l.Writer.MaxOutputBytes() != c.fit:
			t.Errorf("max_payload %d: output limit %d, want %d", c.payload, l.Writer.MaxOutputBytes(), c.fit)
		}
		nc.Close()
		srv.Shutdown()
	}
}
