package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/flowrun/flow/internal/testkit/within"
)

// startUIDaemon starts flowd with --auth (so that /ui/login reads its form) and the
// HTTP limits given.
func startUIDaemon(t *testing.T, limits httpLimits) *Daemon {
	t.Helper()
	dir := t.TempDir()
	users := filepath.Join(dir, "users.yaml")
	if err := os.WriteFile(users, []byte("users:\n  - {user: ann, password: ann-pw-1, role: admin}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := Load([]string{"--data-dir", filepath.Join(dir, "data"), "--http", "127.0.0.1:0", "--nats-listen", "127.0.0.1:0",
		"--node-id", "n1", "--lease-ttl", "1s", "--drain-timeout", "2s", "--scheduler=false", "--auth", users}, []string{})
	if err != nil {
		t.Fatal(err)
	}
	cfg.httpLimits = &limits
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	d, err := Start(ctx, cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Stop)
	return d
}

// A sign-in whose body comes one byte a second is cut off by the server within its read
// timeout plus a margin: the connection is closed by the server. Control: with the
// server as on main (a header timeout only), the connection is still open when the same
// wait ends. A request line and headers over the limit get 431.
func TestSlowBodyIsCutOff(t *testing.T) {
	const read, margin = time.Second, 4 * time.Second
	for _, control := range []bool{false, true} {
		name := "read-timeout"
		limits := defaultHTTPLimits
		limits.read = read
		if control {
			name, limits = "control-header-timeout-only", httpLimits{readHeader: 5 * time.Second}
		}
		t.Run(name, func(t *testing.T) {
			d := startUIDaemon(t, limits)
			conn, err := net.DialTimeout("tcp", d.HTTPAddr(), 5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			start := time.Now()
			if _, err := fmt.Fprintf(conn, "POST /ui/login HTTP/1.1\r\nHost: %s\r\nOrigin: http://%s\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: 100\r\n\r\n",
				d.HTTPAddr(), d.HTTPAddr()); err != nil {
				t.Fatal(err)
			}
			closed := make(chan error, 1)
			go func() { // reads the answer, if any, until the server closes the connection
				_, err := io.Copy(io.Discard, conn)
				closed <- err
			}()
			tick := time.NewTicker(time.Second) // the slow client's pace: a byte a second
			defer tick.Stop()
			deadline := time.After(read + margin)
			for {
				select {
				case err := <-closed:
					if control {
						t.Fatalf("the control shows nothing: the server closed the connection after %s (%v)", time.Since(start), err)
					}
					t.Logf("closed by the server after %s", time.Since(start).Round(time.Millisecond))
					return
				case <-deadline:
					if !control {
						t.Fatalf("the server did not close a slow body's connection within %s", read+margin)
					}
					conn.Close()
					within.Recv(t, 10*time.Second, closed, "the reader of the connection the test closed")
					return
				case <-tick.C:
					_ = conn.SetWriteDeadline(time.Now().Add(time.Second))
					_, _ = conn.Write([]byte("u")) // fails once the server has closed: the read says so
				}
			}
		})
	}
	t.Run("header-limit", func(t *testing.T) {
		d := startUIDaemon(t, defaultHTTPLimits)
		req, _ := http.NewRequest(http.MethodGet, "http://"+d.HTTPAddr()+"/ui/login", nil)
		req.Header.Set("X-Filler", strings.Repeat("x", 2*defaultHTTPLimits.maxHeader))
		resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
			t.Fatalf("a header of %d bytes: %d, want 431", 2*defaultHTTPLimits.maxHeader, resp.StatusCode)
		}
	})
}

// --ui-host and --ui-proxy: checked at start (a port, a URL, a wildcard, a bad name or
// address is refused, naming the option and the fix), read from flags, FLOWD_* and the
// config file (a comma-separated string or a YAML list).
func TestUIHostAndProxyOptions(t *testing.T) {
	for _, c := range []struct {
		args []string
		env  []string
		want string
	}{
		{[]string{"--ui-host", "flow.example.com:8080"}, nil, `ui-host: "flow.example.com:8080": give the name without a port`},
		{[]string{"--ui-host", "[::1]:8080"}, nil, "give the name without a port"},
		{[]string{"--ui-host", "https://flow.example.com"}, nil, "give a name, not a URL"},
		{[]string{"--ui-host", "*.example.com"}, nil, "wildcards are not supported"},
		{[]string{"--ui-host", "0.0.0.0"}, nil, "a wildcard address is no name a browser is sent to"},
		{[]string{"--ui-host", "flow example"}, nil, "is not a host name or an IP address"},
		{[]string{"--ui-host", "999.1.1.1"}, nil, "is not a host name or an IP address"},
		{[]string{"--ui-host", "-flow.example"}, nil, "is not a host name or an IP address"},
		{nil, []string{"FLOWD_UI_HOST=ok.example,bad_port.example:1"}, "ui-host"},
		{[]string{"--ui-proxy", "proxy.example"}, nil, `ui-proxy: "proxy.example": give the proxy's IP address or a CIDR prefix`},
		{[]string{"--ui-proxy", "10.0.0.0/33"}, nil, "ui-proxy"},
	} {
		_, err := Load(c.args, c.env)
		if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Load(%v, %v) = %v; want %q", c.args, c.env, err, c.want)
		}
	}
	c, err := Load([]string{"--ui-host", "Flow.Example.com, 10.0.0.5,[fd00::1],flow_node-1", "--ui-proxy", "10.0.0.7, 10.1.0.0/16,::1"}, []string{})
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(c.UIHosts, " "); got != "flow.example.com 10.0.0.5 fd00::1 flow_node-1" {
		t.Errorf("--ui-host gave %q", got)
	}
	if got := fmt.Sprint(c.UIProxies); got != "[10.0.0.7/32 10.1.0.0/16 ::1/128]" {
		t.Errorf("--ui-proxy gave %s", got)
	}
	file := filepath.Join(t.TempDir(), "flowd.yaml")
	if err := os.WriteFile(file, []byte("ui-host: [flow.example.com, 10.0.0.5]\nui-proxy: 10.0.0.7\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err = Load([]string{"--config", file}, []string{"FLOWD_UI_PROXY=10.0.0.8"})
	if err != nil || strings.Join(c.UIHosts, ",") != "flow.example.com,10.0.0.5" || fmt.Sprint(c.UIProxies) != "[10.0.0.8/32]" {
		t.Fatalf("from the file and the environment: %v %v %v", c.UIHosts, c.UIProxies, err)
	}
}
