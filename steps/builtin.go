package steps

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// KillGrace is the default time a cancelled exec step's process group has between
// SIGTERM and SIGKILL (Exec.KillGrace).
const KillGrace = 2 * time.Second

// Exec runs a command (argv, never through a shell unless argv says `sh -c`).
//
//	with: {command: [prog, args...], env: {K: V}, dir: path, stdin: text}
//
// The environment is flowd's plus `env` plus FLOW_RUN_ID, FLOW_STEP, FLOW_ITEM,
// FLOW_EPOCH, FLOW_IDEMPOTENCY_KEY. A JSON object on stdout is the output; any other
// stdout becomes {"stdout": "..."}.
//
// What stops the process: the command runs in its own process group, which is sent
// SIGTERM when ctx ends (a cancelled run, a step or run timeout, a lost lease, a drain)
// and SIGKILL a grace later: KillGrace, or Input.StopGrace when that is shorter (the
// engine sets it from the lease TTL, so that a lost lease's process is dead before the
// run can move to another node). On Linux the command also gets SIGKILL when this
// process dies (Pdeathsig, set from a thread locked for the child's whole life), and
// the poison pill kills every live group first (KillProcessGroups). docs/workflow-spec.md.
type Exec struct {
	MaxOutput int
	// KillGrace is the time between SIGTERM and SIGKILL when the step is stopped
	// (default: the KillGrace constant, 2s; Input.StopGrace lowers it).
	KillGrace time.Duration
	// PassEnv names variables of this process's environment the command also gets.
	// Without them it gets only BaseEnv of it: flowd's environment holds its secrets
	// (FLOWD_NATS_PASSWORD, a cloud key), and an `env` step's output lands in the log.
	PassEnv []string
}

// BaseEnv are the variables of this process's environment every command gets, besides
// the FLOW_* variables of its step and the step's own `env`.
var BaseEnv = []string{"PATH", "HOME", "LANG", "TZ"}

// environ is what the command gets of this process's environment.
func (x Exec) environ() []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if slices.Contains(BaseEnv, name) || slices.Contains(x.PassEnv, name) {
			env = append(env, kv)
		}
	}
	return env
}

// grace is the time the process group gets between SIGTERM and SIGKILL.
func (x Exec) grace(in Input) time.Duration {
	g := x.KillGrace
	if g <= 0 {
		g = KillGrace
	}
	if in.StopGrace > 0 && in.StopGrace < g {
		g = in.StopGrace
	}
	return g
}

// Run runs the command.
func (x Exec) Run(ctx context.Context, in Input) (json.RawMessage, error) {
	argv, err := stringList(in.With["command"])
	if err != nil || len(argv) == 0 {
		return nil, Permanentf("exec: with.command must be a non-empty list of strings (argv), e.g. [\"./collect.sh\", \"{{ inputs.date }}\"]")
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = x.environ()
	if env, ok := in.With["env"].(map[string]any); ok {
		keys := make([]string, 0, len(env))
		for k := range env {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			cmd.Env = append(cmd.Env, k+"="+text(env[k]))
		}
	} else if in.With["env"] != nil {
		return nil, Permanentf("exec: with.env must be a mapping of names to values")
	}
	cmd.Env = append(cmd.Env,
		"FLOW_RUN_ID="+in.Run, "FLOW_STEP="+in.Step, "FLOW_ITEM="+strconv.Itoa(in.Item),
		"FLOW_EPOCH="+strconv.FormatInt(in.Epoch, 10), "FLOW_IDEMPOTENCY_KEY="+in.IdempotencyKey,
		"FLOW_ATTEMPT="+strconv.Itoa(in.Attempt))
	if dir, ok := in.With["dir"].(string); ok {
		cmd.Dir = dir
	}
	if stdin, ok := in.With["stdin"]; ok {
		cmd.Stdin = strings.NewReader(text(stdin))
	}
	var stdout limitedBuffer
	stdout.limit = x.MaxOutput
	var stderr tailBuffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.SysProcAttr = procAttr()
	waited, err := start(cmd)
	if err != nil {
		return nil, Permanentf("exec: start %s: %v", argv[0], err)
	}
	pgid := cmd.Process.Pid
	// Whatever the group left behind (children of the command still running after it
	// exited, or after SIGTERM) is killed before the step returns.
	defer groupDone(pgid)
	select {
	case err = <-waited:
	case <-ctx.Done():
		_ = syscall.Kill(-pgid, syscall.SIGTERM)
		t := time.NewTimer(x.grace(in))
		select {
		case <-waited:
		case <-t.C:
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
			<-waited
		}
		t.Stop()
		return nil, fmt.Errorf("exec: %s: %w (process group stopped)", argv[0], context.Cause(ctx))
	}
	if stdout.over {
		return nil, Permanentf("exec: %s wrote more than %d bytes to stdout: write large results elsewhere and print a reference", argv[0], x.MaxOutput)
	}
	if err != nil {
		return nil, fmt.Errorf("exec: %s: %v: %s", argv[0], err, strings.TrimSpace(stderr.String()))
	}
	out := bytes.TrimSpace(stdout.Bytes())
	if len(out) > 0 && out[0] == '{' && json.Valid(out) {
		return json.RawMessage(out), nil
	}
	b, _ := json.Marshal(map[string]string{"stdout": string(out)})
	return b, nil
}

// HTTP sends one request.
//
//	with: {method: POST, url: ..., headers: {K: V}, body: any}
//
// It sends Flow-Run-Id, Flow-Epoch, Flow-Step, Flow-Item and Idempotency-Key headers.
// 2xx: a JSON body is the output (otherwise {"status", "body"}). 408, 425, 429 and 5xx
// are retryable; other statuses are permanent (a 409 from a ledger that saw a newer
// epoch must not be retried).
type HTTP struct {
	MaxOutput int
	Client    *http.Client
}

// Run sends the request.
func (h HTTP) Run(ctx context.Context, in Input) (json.RawMessage, error) {
	url, _ := in.With["url"].(string)
	if url == "" {
		return nil, Permanentf("http: with.url is required")
	}
	method, _ := in.With["method"].(string)
	var body io.Reader
	if b, ok := in.With["body"]; ok {
		raw, err := json.Marshal(b)
		if err != nil {
			return nil, Permanentf("http: body: %v", err)
		}
		body = bytes.NewReader(raw)
		if method == "" {
			method = http.MethodPost
		}
	}
	if method == "" {
		method = http.MethodGet
	}
	req, err := http.NewRequestWithContext(ctx, strings.ToUpper(method), url, body)
	if err != nil {
		return nil, Permanentf("http: %v", err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if hs, ok := in.With["headers"].(map[string]any); ok {
		for k, v := range hs {
			req.Header.Set(k, text(v))
		}
	}
	req.Header.Set("Flow-Run-Id", in.Run)
	req.Header.Set("Flow-Epoch", strconv.FormatInt(in.Epoch, 10))
	req.Header.Set("Flow-Step", in.Step)
	req.Header.Set("Flow-Item", strconv.Itoa(in.Item))
	req.Header.Set("Idempotency-Key", in.IdempotencyKey)
	client := h.Client
	if client == nil {
		client = http.DefaultClient
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("http: %s %s: %w", req.Method, url, err)
	}
	defer resp.Body.Close()
	var buf limitedBuffer
	buf.limit = h.MaxOutput
	if _, err := io.Copy(&buf, resp.Body); err != nil {
		return nil, fmt.Errorf("http: read the response of %s: %w", url, err)
	}
	if buf.over {
		return nil, Permanentf("http: the response of %s is over %d bytes", url, h.MaxOutput)
	}
	data := bytes.TrimSpace(buf.Bytes())
	switch c := resp.StatusCode; {
	case c >= 200 && c < 300:
	case c == 408 || c == 425 || c == 429 || c >= 500:
		return nil, fmt.Errorf("http: %s %s: %s: %s", req.Method, url, resp.Status, snippet(data))
	default:
		return nil, Permanentf("http: %s %s: %s: %s", req.Method, url, resp.Status, snippet(data))
	}
	if len(data) > 0 && json.Valid(data) {
		return json.RawMessage(data), nil
	}
	b, _ := json.Marshal(map[string]any{"status": resp.StatusCode, "body": string(data)})
	return b, nil
}

// sleep waits `duration` (or until cancelled).
func sleep(ctx context.Context, in Input) (json.RawMessage, error) {
	s, _ := in.With["duration"].(string)
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return nil, Permanentf("sleep: with.duration %q is not a duration such as 1s", s)
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return json.RawMessage(`{}`), nil
	case <-ctx.Done():
		return nil, fmt.Errorf("sleep: %w", context.Cause(ctx))
	}
}

func stringList(v any) ([]string, error) {
	list, ok := v.([]any)
	if !ok {
		return nil, errors.New("not a list")
	}
	out := make([]string, len(list))
	for i, x := range list {
		out[i] = text(x)
	}
	return out, nil
}

func text(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case float64:
		return strconv.FormatFloat(x, 'f', -1, 64)
	case json.Number:
		return x.String()
	case nil:
		return ""
	default:
		b, _ := json.Marshal(x)
		return string(b)
	}
}

func snippet(b []byte) string {
	if len(b) > 200 {
		return string(b[:200]) + "..."
	}
	return string(b)
}

// limitedBuffer keeps up to limit bytes and notes whether more came. (It does not
// embed bytes.Buffer: io.Copy would use the Buffer's ReadFrom and skip the limit.)
type limitedBuffer struct {
	buf   bytes.Buffer
	limit int
	over  bool
}

func (b *limitedBuffer) Write(p []byte) (int, error) {
	if room := b.limit - b.buf.Len(); len(p) > room {
		b.over = true
		if room > 0 {
			b.buf.Write(p[:room])
		}
		return len(p), nil
	}
	return b.buf.Write(p)
}

func (b *limitedBuffer) Bytes() []byte { return b.buf.Bytes() }

// tailBuffer keeps the last 4 KiB (stderr, for error messages).
type tailBuffer struct{ b []byte }

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.b = append(t.b, p...)
	if len(t.b) > 4096 {
		t.b = t.b[len(t.b)-4096:]
	}
	return len(p), nil
}

func (t *tailBuffer) String() string { return string(t.b) }
