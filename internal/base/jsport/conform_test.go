package jsport_test

import (
	"context"
	"testing"
	"time"

	"github.com/flowrun/flow/internal/base/jsport"
	"github.com/flowrun/flow/internal/base/port/porttest"
)

// TestJetStreamConforms runs the ports' conformance suite on a real embedded NATS
// server, each case on a fresh one: what the simulation assumes of JetStream holds of
// JetStream (engine/internal/sim's TestServerConforms runs the same cases on the
// simulation's server).
func TestJetStreamConforms(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for lapses and redeliveries in real time")
	}
	const ttl = time.Second
	for _, c := range porttest.Cases {
		t.Run(c.Name, func(t *testing.T) {
			js := serverJS(t)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			kv, err := jsport.OpenKV(ctx, js, jsport.LeasesConfig(ttl, 1), nil)
			if err != nil {
				t.Fatal(err)
			}
			log, err := jsport.OpenStream(ctx, js, jsport.LogConfig(1))
			if err != nil {
				t.Fatal(err)
			}
			q, err := jsport.OpenQueue(ctx, js, 1, ttl, nil)
			if err != nil {
				t.Fatal(err)
			}
			c.Run(t, porttest.Env{KV: kv, TTL: ttl, Log: log, Tasks: q, AckWait: ttl})
		})
	}
}
