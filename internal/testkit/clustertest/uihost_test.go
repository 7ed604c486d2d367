package clustertest

import (
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"
)

// uiRequest is one request to a flowd's UI with the Host a browser would send for the
// name it was pointed at, and the cookies given.
func uiRequest(t *testing.T, method, httpAddr, path, host string, form url.Values, header http.Header, cookies []*http.Cookie) (*http.Response, string) {
	t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, "http://"+httpAddr+path, body)
	if err != nil {
		t.Fatal(err)
	}
	req.Host = host
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for k, v := range header {
		req.Header[k] = v
	}
	for _, c := range cookies {
		req.AddCookie(c)
	}
	c := &http.Client{Timeout: 20 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

var uiCSRF = regexp.MustCompile(`name="csrf" value="([0-9a-f]+)"`)

// The DNS rebinding of issue 24 against a real flowd without --auth: a page of
// rebind.evil.example, whose name now resolves to 127.0.0.1, asks for a run's page and
// posts a cancel with its own Origin (which matches the Host it sends) and even with a
// valid session cookie and CSRF token of this browser's. Both get 421 and the run runs
// on. The names flowd answers to (loopback, --ui-host) get their pages; /metrics answers
// any Host (docs/ui.md). Control: flowd linked with webui.unsafeAnyHost=1 (the Host
// allow-list alone off): the rebinding page reads the run's page and its token; its
// cancel is then refused by the Origin check, the other guard (403, the run runs on).
func TestUIRebindingIsMisdirected(t *testing.T) {
	t.Parallel() // no timing assertion: it runs beside the others (docs/testing.md, "How the suite is run")
	for _, control := range []bool{false, true} {
		name := "allow-list"
		if control {
			name = "control-any-host"
		}
		t.Run(name, func(t *testing.T) {
			bin := ""
			if control {
				bin = FlowdLinkedWith(t, "github.com/flowrun/flow/internal/app/webui.unsafeAnyHost=1")
			} else {
				bin = Binaries(t) + "/flowd"
			}
			_, natsURL, httpAddr := embeddedFlowdBin(t, bin, "--ui-host", "flow.test")
			applyYAML(t, natsURL, t.TempDir(), "slow", slowStep)
			mustFlowctl(t, natsURL, "run", "start", "slow", "--id", "held")
			WaitFor(t, 60*time.Second, "held running", func() bool { return runOf(t, natsURL, "held").Status == "running" })
			_, port, _ := strings.Cut(httpAddr, ":")
			evil := "rebind.evil.example:" + port

			page, body := uiRequest(t, http.MethodGet, httpAddr, "/ui/runs/held", evil, nil, nil, nil)
			if control {
				m := uiCSRF.FindStringSubmatch(body)
				if page.StatusCode != http.StatusOK || m == nil {
					t.Fatalf("the control shows nothing: the rebinding page got %d without a token", page.StatusCode)
				}
				resp, _ := uiRequest(t, http.MethodPost, httpAddr, "/ui/runs/held/cancel", evil, url.Values{"csrf": {m[1]}},
					http.Header{"Origin": {"http://" + evil}}, page.Cookies())
				if resp.StatusCode != http.StatusForbidden || runOf(t, natsURL, "held").Status != "running" {
					t.Fatalf("the rebinding cancel with the allow-list alone off: %d, the run %s; want the Origin check's 403", resp.StatusCode, runOf(t, natsURL, "held").Status)
				}
				return
			}
			if page.StatusCode != http.StatusMisdirectedRequest || strings.Contains(body, `name="csrf"`) {
				t.Fatalf("the rebinding page: %d\n%s", page.StatusCode, body)
			}
			// This browser's own session, by a name flowd answers to.
			for _, host := range []string{"flow.test:" + port, "localhost:" + port, "127.0.0.1", "[::1]:" + port} {
				if resp, _ := uiRequest(t, http.MethodGet, httpAddr, "/ui/runs/held", host, nil, nil, nil); resp.StatusCode != http.StatusOK {
					t.Errorf("Host %s: %d, want 200", host, resp.StatusCode)
				}
			}
			own, body := uiRequest(t, http.MethodGet, httpAddr, "/ui/runs/held", "flow.test:"+port, nil, nil, nil)
			m := uiCSRF.FindStringSubmatch(body)
			if m == nil {
				t.Fatalf("no token on the run's page:\n%s", body)
			}
			resp, body := uiRequest(t, http.MethodPost, httpAddr, "/ui/runs/held/cancel", evil, url.Values{"csrf": {m[1]}},
				http.Header{"Origin": {"http://" + evil}}, own.Cookies())
			if resp.StatusCode != http.StatusMisdirectedRequest {
				t.Fatalf("the rebinding cancel: %d %s", resp.StatusCode, body)
			}
			if resp, _ := uiRequest(t, http.MethodGet, httpAddr, "/metrics", evil, nil, nil, nil); resp.StatusCode != http.StatusOK {
				t.Errorf("/metrics with another Host: %d, want 200 (it answers any)", resp.StatusCode)
			}
			// A cancel the UI took is in the log before its 303 (the control's is seen at
			// once); this one was refused before any handler ran.
			if st := runOf(t, natsURL, "held").Status; st != "running" {
				t.Fatalf("the refused cancel changed the run: %s", st)
			}
		})
	}
}
