package logstream

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/flowrun/flow/internal/base/port"
)

// fakeStream is a log that is not nil and panics if used.
type fakeStream struct{ port.Stream }

// Validate names the field it refuses and the fix, refuses zero limits instead of
// filling them in, and accepts DefaultConfig with the three required fields set. Open
// refuses what Validate refuses before it touches NATS.
func TestConfigValidateNamesTheField(t *testing.T) {
	store := memStore(t)
	valid := testConfigOn(fakeStream{}, store, "node-a")
	if err := valid.Validate(); err != nil {
		t.Fatalf("DefaultConfig with Stream, Store and Node: %v", err)
	}
	for _, c := range []struct {
		field string
		set   func(*Config)
	}{
		{"Stream", func(c *Config) { c.Stream = nil }},
		{"Store", func(c *Config) { c.Store = nil }},
		{"Node", func(c *Config) { c.Node = "a b" }},
		{"Node", func(c *Config) { c.Node = "" }},
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
		if !reflect.DeepEqual(cfg, before) {
			t.Errorf("%s: Validate changed its argument", c.field)
		}
	}
	// Without DefaultConfig the limits are zero: refused, not filled in.
	bare := Config{Stream: fakeStream{}, Store: store, Node: "node-a"}
	if _, err := Open(bare); !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "DefaultConfig") {
		t.Fatalf("Open of a Config without its defaults: %v; want ErrInvalidConfig pointing to DefaultConfig", err)
	}
}
