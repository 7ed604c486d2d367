package steps

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
)

// An exec command gets PATH, HOME, LANG, TZ, its step's FLOW_* variables and its own
// env, and of the rest of this process's environment (flowd's: its secrets) only what
// --exec-env names. (Before: the whole environment, and an `env` step stored it in the
// log.)
func TestExecGetsAMinimalEnvironment(t *testing.T) {
	t.Setenv("AWS_SECRET_ACCESS_KEY", "aws-secret-1")
	t.Setenv("FLOWD_NATS_PASSWORD", "nats-secret-1")
	t.Setenv("PGHOST", "db.internal")
	t.Setenv("LANG", "C.UTF-8")
	run := func(x Exec) map[string]string {
		t.Helper()
		out, err := x.Run(context.Background(), in(map[string]any{"command": list("env"), "env": map[string]any{"REGION": "eu"}}))
		if err != nil {
			t.Fatal(err)
		}
		var o struct{ Stdout string }
		if err := json.Unmarshal(out, &o); err != nil {
			t.Fatal(err)
		}
		vars := map[string]string{}
		for _, line := range strings.Split(o.Stdout, "\n") {
			if k, v, ok := strings.Cut(line, "="); ok {
				vars[k] = v
			}
		}
		return vars
	}
	got := run(Exec{MaxOutput: 1 << 20})
	for _, secret := range []string{"AWS_SECRET_ACCESS_KEY", "FLOWD_NATS_PASSWORD", "PGHOST"} {
		if v, ok := got[secret]; ok {
			t.Errorf("the step got %s=%s", secret, v)
		}
	}
	for _, want := range []string{"PATH", "LANG", "REGION", "FLOW_RUN_ID", "FLOW_EPOCH", "FLOW_IDEMPOTENCY_KEY"} {
		if _, ok := got[want]; !ok {
			t.Errorf("the step did not get %s: %v", want, got)
		}
	}
	if got := run(Exec{MaxOutput: 1 << 20, PassEnv: []string{"PGHOST"}}); got["PGHOST"] != "db.internal" || got["AWS_SECRET_ACCESS_KEY"] != "" {
		t.Errorf("with PGHOST passed: %v", got)
	}
	if got := run(NewRegistry(0, WithExecEnv("PGHOST")).kinds["exec"].(Exec)); got["PGHOST"] != "db.internal" {
		t.Errorf("WithExecEnv: %v", got)
	}
}
