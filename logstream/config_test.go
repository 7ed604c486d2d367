package logstream

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// fakeJS is a JetStream that is not nil and fails the test if used.
type fakeJS struct{ jetstream.JetStream }

// Validate names the field it refuses and the fix, refuses zero limits instead of
// filling them in, and accepts DefaultConfig with the three required fields set. Open
// refuses what Validate refuses before it touches NATS.
func TestConfigValidateNamesTheField(t *testing.T) {
	store := memStore(t)
	valid := testConfig(fakeJS{}, store, "node-a")
	if err := valid.Validate(); err != nil {
		t.Fatalf("DefaultConfig with JS, Store and Node: %v", err)
	}
	for _, c := range []struct {
		field string
		set   func(*Config)
	}{
		{"JS", func(c *Config) { c.JS = nil }},
		{"Store", func(c *Config) { c.Store = nil }},
		{"Node", func(c *Config) { c.Node = "a b" }},
		{"Node", func(c *Config) { c.Node = "" }},
		{"Stream", func(c *Config) { c.Stream = "" }},
		{"Subject", func(c *Config) { c.Subject = "" }},
		{"Replicas", func(c *Config) { c.Replicas = 0 }},
		{"MaxOutputBytes", func(c *Config) { c.MaxOutputBytes = 0 }},
		{"MaxBatchEntries", func(c *Config) { c.MaxBatchEntries = -1 }},
		{"StallTimeout", func(c *Config) { c.StallTimeout = 0 }},
		{"NoteDelay", func(c *Config) { c.NoteDelay = 0 }},
		{"PublishTimeout", func(c *Config) { c.PublishTimeout = -time.Second }},
	} {
		cfg := valid
		c.set(&cfg)
		before := cfg
		err := cfg.Validate()
		if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "Config."+c.field+" ") || !strings.Contains(err.Error(), ": set it") && !strings.Contains(err.Error(), ": use") {
			t.Errorf("%s: %v; want ErrInvalidConfig naming Config.%s and the fix", c.field, err, c.field)
		}
		if cfg != before {
			t.Errorf("%s: Validate changed its argument", c.field)
		}
	}
	// Without DefaultConfig the limits are zero: refused, not filled in.
	bare := Config{JS: fakeJS{}, Store: store, Node: "node-a"}
	if _, err := Open(ctxT(t), bare); !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "DefaultConfig") {
		t.Fatalf("Open of a Config without its defaults: %v; want ErrInvalidConfig pointing to DefaultConfig", err)
	}
}
