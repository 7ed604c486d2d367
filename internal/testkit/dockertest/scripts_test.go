package dockertest

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// scriptBox is a copy of deploy/'s scripts beside a docker-compose that records what it
// is asked and answers `port` as a real one would: the scripts tried without Docker.
type scriptBox struct {
	t           *testing.T
	deploy, log string
	env         []string
}

func newScriptBox(t *testing.T) *scriptBox {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", "..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	b := &scriptBox{t: t, deploy: filepath.Join(dir, "deploy"), log: filepath.Join(dir, "compose.log")}
	for _, d := range []string{filepath.Join(b.deploy, "run"), filepath.Join(dir, "bin")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"up.sh", "down.sh"} {
		src, err := os.ReadFile(filepath.Join(root, "deploy", name))
		if err != nil {
			t.Fatalf("deploy/%s: %v", name, err)
		}
		write(t, filepath.Join(b.deploy, name), string(src), 0o755)
	}
	write(t, filepath.Join(b.deploy, "build-image.sh"), "#!/bin/sh\necho built flow:dev\n", 0o755)
	write(t, filepath.Join(b.deploy, "run", "nats-1.conf"), "# made by setup.sh\n", 0o644)
	// `port SERVICE 8080` answers the loopback address compose published the UI on: the
	// port FLOW_UI_PORT_<n> chose, or the default.
	write(t, filepath.Join(dir, "bin", "docker-compose"), `#!/bin/sh
echo "$*" >> "$COMPOSE_LOG"
case " $* " in
*" port flowd-1 8080 "*) echo "127.0.0.1:${FLOW_UI_PORT_1:-8081}" ;;
*" port flowd-2 8080 "*) echo "127.0.0.1:${FLOW_UI_PORT_2:-8082}" ;;
*" port flowd-3 8080 "*) echo "127.0.0.1:${FLOW_UI_PORT_3:-8083}" ;;
esac
`, 0o755)
	b.env = append(os.Environ(), "PATH="+filepath.Join(dir, "bin")+":"+os.Getenv("PATH"), "COMPOSE_LOG="+b.log)
	return b
}

func write(t *testing.T, path, s string, mode os.FileMode) {
	t.Helper()
	if err := os.WriteFile(path, []byte(s), mode); err != nil {
		t.Fatal(err)
	}
}

// run runs a script of the box with env added; it returns its output and what
// docker-compose was asked since the last run.
func (b *scriptBox) run(script string, env []string, args ...string) (string, []string) {
	b.t.Helper()
	_ = os.Remove(b.log)
	cmd := exec.Command("sh", append([]string{filepath.Join(b.deploy, script)}, args...)...)
	cmd.Env = append(b.env, env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		b.t.Fatalf("%s %s: %v\n%s", script, strings.Join(args, " "), err, out)
	}
	asked, _ := os.ReadFile(b.log)
	return string(out), strings.Split(strings.TrimSpace(string(asked)), "\n")
}

// Issue 38: up.sh prints the UI's address with the port compose published it on (a
// fixed 8081 was printed whatever FLOW_UI_PORT_1 said), and the cluster has a documented
// teardown, down.sh, that up.sh's help names: the containers go and the data stays,
// unless --volumes.
func TestUpPrintsTheUIPortAndDownTearsDown(t *testing.T) {
	b := newScriptBox(t)
	out, _ := b.run("up.sh", []string{"FLOW_UI_PORT_1=18081", "FLOW_UI_PORT_2=18082", "FLOW_UI_PORT_3=18083"})
	for _, want := range []string{"http://localhost:18081/ui/", "18082", "18083", "down.sh"} {
		if !strings.Contains(out, want) {
			t.Errorf("up.sh with FLOW_UI_PORT_1..3=18081..18083 does not print %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, ":8081") {
		t.Errorf("up.sh prints the default port although another was used:\n%s", out)
	}
	if out, _ := b.run("up.sh", nil); !strings.Contains(out, "http://localhost:8081/ui/") {
		t.Errorf("up.sh with the default ports:\n%s", out)
	}

	out, asked := b.run("up.sh", nil, "--help")
	if !strings.Contains(out, "down.sh") || !strings.Contains(out, "--volumes") || len(asked) != 1 || asked[0] != "" {
		t.Errorf("up.sh --help: %q, docker-compose asked %q; want the usage naming the teardown, and nothing started", out, asked)
	}
	for _, c := range []struct {
		args []string
		want string
	}{{nil, "down"}, {[]string{"--volumes"}, "down --volumes"}} {
		_, asked := b.run("down.sh", nil, c.args...)
		if last := asked[len(asked)-1]; !strings.HasSuffix(last, " "+c.want) || !strings.Contains(last, "compose.yaml") {
			t.Errorf("down.sh %v asked docker-compose %q; want %q on compose.yaml", c.args, asked, c.want)
		}
	}
	if out, _ := b.run("down.sh", nil, "--help"); !strings.Contains(out, "--volumes") {
		t.Errorf("down.sh --help: %q", out)
	}
}
