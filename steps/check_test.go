package steps

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

// Each kind's CheckWith refuses what its Run would refuse, naming the key, and accepts
// templates wherever they stand.
func TestCheckWithBuiltins(t *testing.T) {
	r := NewRegistry(0)
	cases := []struct {
		kind string
		with map[string]any
		path string // "" when accepted
	}{
		{"sleep", map[string]any{"duration": "1s"}, ""},
		{"sleep", map[string]any{"duration": "0s"}, ""},
		{"sleep", map[string]any{"duration": "{{ inputs.wait }}"}, ""},
		{"sleep", map[string]any{"duration": "soon"}, "with.duration"},
		{"sleep", map[string]any{"duration": "-1s"}, "with.duration"},
		{"sleep", map[string]any{"duration": float64(5)}, "with.duration"},
		{"sleep", nil, "with.duration"},
		{"exec", map[string]any{"command": []any{"ls", "-l", float64(2), "{{ inputs.dir }}"}, "env": map[string]any{"A": "b"}, "dir": "/tmp"}, ""},
		{"exec", map[string]any{"command": "{{ inputs.argv }}"}, ""},
		{"exec", map[string]any{"command": []any{}}, "with.command"},
		{"exec", map[string]any{"command": "ls"}, "with.command"},
		{"exec", map[string]any{}, "with.command"},
		{"exec", map[string]any{"command": []any{"echo", map[string]any{"hi": nil}}}, "with.command[1]"},
		{"exec", map[string]any{"command": []any{"ls"}, "env": []any{"A=b"}}, "with.env"},
		{"exec", map[string]any{"command": []any{"ls"}, "dir": float64(1)}, "with.dir"},
		{"http", map[string]any{"url": "https://example.com/x", "method": "post", "headers": map[string]any{"A": "b"}}, ""},
		{"http", map[string]any{"url": "{{ inputs.url }}", "method": "{{ inputs.method }}"}, ""},
		{"http", map[string]any{"url": "http://127.0.0.1:9090/credit/{{ item.id }}"}, ""},
		{"http", map[string]any{"url": "https://example.com", "method": "POTS"}, "with.method"},
		{"http", map[string]any{"url": "example.com/x"}, "with.url"},
		{"http", map[string]any{"url": "ftp://example.com/x"}, "with.url"},
		{"http", map[string]any{"url": "http://"}, "with.url"},
		{"http", map[string]any{"method": "GET"}, "with.url"},
		{"http", map[string]any{"url": "https://example.com", "headers": "A: b"}, "with.headers"},
		{"noop", map[string]any{"anything": []any{nil}}, ""},
		{"not-registered", map[string]any{"x": 1}, ""},
	}
	for _, c := range cases {
		err := r.CheckWith(c.kind, c.with)
		if c.path == "" {
			if err != nil {
				t.Errorf("%s %v: %v; want accepted", c.kind, c.with, err)
			}
			continue
		}
		var we *WithError
		if !errors.As(err, &we) || !strings.HasPrefix(err.Error(), c.path+": ") {
			t.Errorf("%s %v: %v; want a *WithError at %s", c.kind, c.with, err, c.path)
		}
	}
}

// A registered kind's checker applies, through the method or WithCheck, and a
// checker's panic is an error.
func TestCheckWithRegistered(t *testing.T) {
	r := NewRegistry(0)
	nop := Func(func(context.Context, Input) (json.RawMessage, error) { return nil, nil })
	if err := r.Register("payout", WithCheck(nop, func(with map[string]any) error {
		if _, ok := with["account"].(string); !ok {
			return &WithError{Path: []string{"account"}, Msg: "is required"}
		}
		return nil
	})); err != nil {
		t.Fatal(err)
	}
	if err := r.Register("boom", WithCheck(nop, func(with map[string]any) error { panic("no") })); err != nil {
		t.Fatal(err)
	}
	if err := r.CheckWith("payout", map[string]any{}); err == nil || err.Error() != "with.account: is required" {
		t.Fatalf("payout: %v", err)
	}
	if err := r.CheckWith("payout", map[string]any{"account": "a"}); err != nil {
		t.Fatalf("payout ok: %v", err)
	}
	if err := r.CheckWith("boom", nil); err == nil || !strings.Contains(err.Error(), "panicked") {
		t.Fatalf("boom: %v", err)
	}
	s, _ := r.Get("payout")
	if _, err := s.Run(context.Background(), Input{}); err != nil {
		t.Fatalf("a wrapped step still runs: %v", err)
	}
}
