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
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/propagation"

	"github.com/flowrun/flow/internal/base/tracing"
)

// KillGrace is the default time a stopped exec step's processes have between SIGTERM
// and SIGKILL (Exec.KillGrace).
const KillGrace = 2 * time.Second

// Exec runs a command (argv, never through a shell unless argv says `sh -c`).
//
//	with: {command: [prog, args...], env: {K: V}, dir: path, stdin: text}
//
// The environment is BaseEnv and PassEnv of this process's, plus `env`, plus
// FLOW_RUN_ID, FLOW_STEP, FLOW_ITEM, FLOW_EPOCH, FLOW_IDEMPOTENCY_KEY, FLOW_ATTEMPT,
// TMPDIR (its working directory, when it gets a fresh one), and
// TRACEPARENT when the run is traced (the step attempt's span, W3C). A
// JSON object on stdout is the output; any other stdout becomes {"stdout": "..."}. The
// command runs in a fresh, empty working directory of its own, removed after it,
// unless `dir` names one.
//
// What stops the processes: the command runs contained (Containment: a PID namespace
// of its own under a small init, or that init as a child subreaper), so that stopping
// the step stops every process it started, however forked. When ctx ends (a cancelled
// run, a step or run timeout, a lost lease, a drain) every process of the step gets
// SIGTERM and SIGKILL a grace later: KillGrace, or Input.StopGrace when that is shorter
// (the engine sets it from the lease TTL, so that a lost lease's processes are dead
// before the run can move to another node). When the command exits, whatever it left
// running is killed before the step returns. When this process dies, or is frozen past
// Input.TrustUntil, the init kills them all. The poison pill kills every live step
// first (KillProcessGroups). docs/workflow-spec.md, docs/security.md.
type Exec struct {
	MaxOutput int
	// KillGrace is the time between SIGTERM and SIGKILL when the step is stopped
	// (default: the KillGrace constant, 2s; Input.StopGrace lowers it).
	KillGrace time.Duration
	// PassEnv names variables of this process's environment the command also gets.
	// Without them it gets only BaseEnv of it: flowd's environment holds its secrets
	// (FLOWD_NATS_PASSWORD, a cloud key), and an `env` step's output lands in the log.
	PassEnv []string
	// User, if set, is the user the command runs as (flowd --exec-user; this process
	// must be allowed to switch: User.CheckSwitch). HOME is then the user's home.
	User *User

	// mode, if set, is the containment to use instead of Containment() (tests of both
	// modes in one process).
	mode Mode
}

// BaseEnv are the variables of this process's environment every command gets, besides
// the FLOW_* variables of its step and the step's own `env`.
var BaseEnv = []string{"PATH", "HOME", "LANG", "TZ"}

// environ is what the command gets of this process's environment.
func (x Exec) environ() []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if x.User != nil && name == "HOME" {
			continue // flowd's home is not the user's
		}
		if slices.Contains(BaseEnv, name) || slices.Contains(x.PassEnv, name) {
			env = append(env, kv)
		}
	}
	if x.User != nil && x.User.Home != "" {
		env = append(env, "HOME="+x.User.Home)
	}
	return env
}

// grace is the time the processes get between SIGTERM and SIGKILL.
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

func (x Exec) containment() Mode {
	if x.mode != "" {
		return x.mode
	}
	return Containment()
}

// Run runs the command.
func (x Exec) Run(ctx context.Context, in Input) (json.RawMessage, error) {
	argv, err := stringList(in.With["command"])
	if err != nil || len(argv) == 0 {
		return nil, Permanentf("exec: with.command must be a non-empty list of strings (argv), e.g. [\"./collect.sh\", \"{{ inputs.date }}\"]")
	}
	p := &process{args: argv, env: x.environ(), user: x.User, grace: x.grace(in), trust: in.TrustUntil}
	if env, ok := in.With["env"].(map[string]any); ok {
		keys := make([]string, 0, len(env))
		for k := range env {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			p.env = append(p.env, k+"="+text(env[k]))
		}
	} else if in.With["env"] != nil {
		return nil, Permanentf("exec: with.env must be a mapping of names to values")
	}
	p.env = append(p.env,
		"FLOW_RUN_ID="+in.Run, "FLOW_STEP="+in.Step, "FLOW_ITEM="+strconv.Itoa(in.Item),
		"FLOW_EPOCH="+strconv.FormatInt(in.Epoch, 10), "FLOW_IDEMPOTENCY_KEY="+in.IdempotencyKey,
		"FLOW_ATTEMPT="+strconv.Itoa(in.Attempt))
	if tp := tracing.Traceparent(ctx); tp != "" {
		p.env = append(p.env, "TRACEPARENT="+tp) // the step attempt's span: the command's own spans join the run's trace
	}
	p.dir, _ = in.With["dir"].(string)
	if p.path, err = programPath(argv[0], p.dir != ""); err != nil {
		return nil, Permanentf("exec: start %s: %v", argv[0], err)
	}
	if p.dir == "" {
		if p.dir, err = workDir(x.User); err != nil {
			return nil, fmt.Errorf("exec: %s: %w", argv[0], err)
		}
		// Its temporary files go there too (removed with it), unless the step says
		// otherwise: flowd's own TMPDIR may be one the step's user cannot write.
		if !slices.ContainsFunc(p.env, func(kv string) bool { return strings.HasPrefix(kv, "TMPDIR=") }) {
			p.env = append(p.env, "TMPDIR="+p.dir)
		}
		// After run: every process of the step is dead by then (but for ones it could
		// not kill, docs/security.md), so nothing writes into it any more.
		defer removeWorkDir(p.dir, in.Logger)
	}
	if stdin, ok := in.With["stdin"]; ok {
		p.stdin = strings.NewReader(text(stdin))
	}
	var stdout limitedBuffer
	stdout.limit = x.MaxOutput
	var stderr tailBuffer
	p.stdout, p.stderr = tee(&stdout, in.Stdout), tee(&stderr, in.Stderr)
	o := p.run(ctx, x.containment())
	switch {
	case o.start != nil:
		return nil, Permanentf("exec: start %s: %v", argv[0], o.start)
	case o.stopped:
		return nil, fmt.Errorf("exec: %s: %w (its processes stopped)", argv[0], context.Cause(ctx))
	}
	if stdout.over {
		return nil, Permanentf("exec: %s wrote more than %d bytes to stdout: write large results elsewhere and print a reference", argv[0], x.MaxOutput)
	}
	if o.exit != nil {
		// %w: the exit carries ErrTrustDeadline when the step's init stopped it, which the
		// worker must see (a stop at the trust deadline is not the step's failure).
		return nil, fmt.Errorf("exec: %s: %w: %s", argv[0], o.exit, strings.TrimSpace(stderr.String()))
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
	tracing.Inject(ctx, propagation.HeaderCarrier(req.Header)) // traceparent: the step attempt's span
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
	if in.Stdout != nil {
		fmt.Fprintf(in.Stdout, "%s %s: %s\n%s\n", req.Method, url, resp.Status, data[:min(len(data), httpLogBytes)])
	}
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
	var d time.Duration
	if until, ok, err := SleepUntil(in.With); err != nil {
		return nil, err
	} else if ok {
		d = time.Until(until) // the engine parks a sleep until a later time; this is what is left
	} else if d, err = SleepDuration(in.With); err != nil {
		return nil, err
	}
	t := time.NewTimer(max(d, 0))
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
// httpLogBytes is how much of an http step's response its step log keeps.
const httpLogBytes = 4 << 10

// tee is w, also writing to copyTo when there is one (the step log).
func tee(w io.Writer, copyTo io.Writer) io.Writer {
	if copyTo == nil {
		return w
	}
	return io.MultiWriter(w, copyTo)
}

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
