package steps

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"
)

// The step init is this very program, started again through /proc/self/exe with
// initArg0 as its argv[0] (as Docker's reexec does): the init function of this package
// (stepinit_linux.go) sees the marker and runs the init instead of the program's main.
// Every program that links package steps (flowd, an embedding program, a test binary)
// carries it, and /proc/self/exe names the running binary even after an upgrade
// replaced the file on disk.
const initArg0 = "flow-step-init"

// The init's file descriptors besides 0, 1 and 2 (which the command gets as they are).
const (
	initControlFD = 3 // flowd -> init: the spec, then trust, stop and kill lines
	initReportFD  = 4 // init -> flowd: started or failed, then the command's status
)

// initEnv is the init's own environment: none of flowd's (not nil: nil would be this
// process's), but for the race detector's, which in a -race build (tests) would sleep a
// second before every init's exit (atexit_sleep_ms). The command's comes in the spec.
var initEnv = []string{"GORACE=atexit_sleep_ms=0"}

// initSpec is the first line flowd writes to the init's control pipe.
type initSpec struct {
	Probe bool     `json:"probe,omitempty"` // answer "ok" and exit: the namespaces work
	Mode  Mode     `json:"mode"`
	Path  string   `json:"path"`
	Args  []string `json:"args"`
	Env   []string `json:"env"`
	Dir   string   `json:"dir"`
	User  *User    `json:"user,omitempty"`
	// Trust is when the step's right to act ends unless extended, on CLOCK_MONOTONIC
	// (the same clock in every process of the machine), in nanoseconds; 0: no deadline.
	Trust int64 `json:"trust,omitempty"`
	// Grace is the time between SIGTERM and SIGKILL when the trust deadline passes.
	Grace time.Duration `json:"grace"`
	// PrivateProc: mount a fresh /proc (pid-namespace mode, in the init's own mount
	// namespace) before the command starts, so that the step sees only its own
	// processes. The probe says whether the kernel allows it (privateProc). Only for a
	// step running as another user: a root step could unmount it (and sees everything
	// anyway), and one of flowd's own user is in user-pid-namespace mode, whose init has
	// no privilege to mount.
	PrivateProc bool `json:"private_proc,omitempty"`
	// Dumpable leaves the init dumpable: the negative control of the tests of a step
	// that traces its init (keepInitDumpable). flowd never sets it.
	Dumpable bool `json:"dumpable,omitempty"`
	// SlowStart makes the init wait this long before it starts the command, as an init
	// starved of the CPU would: the tests of a trust extension that reaches the init
	// after its first deadline passed (initStartDelay). flowd never sets it.
	SlowStart time.Duration `json:"slow_start,omitempty"`
	// IgnoreLateTrust: the control of lateTrust (ignoreLateTrust). flowd never sets it.
	IgnoreLateTrust bool `json:"ignore_late_trust,omitempty"`
}

// Switches of the tests' negative controls (trace_linux_test.go), never set
// otherwise: keepInitDumpable leaves the step init dumpable (so that a step running as
// the init's user may ptrace it), noOutsideWatchdog takes away flowd's own kill at the
// trust deadline (forwardTrust), leaving the init alone to do it.
var keepInitDumpable, noOutsideWatchdog bool

// More switches of the tests (contain_linux_test.go), never set otherwise:
// initStartDelay is the init's SlowStart; ignoreLateTrust is the control of the init's
// reading of the trust extensions already sent when a deadline fires (lateTrust): it
// stops the step at a deadline flowd had moved before it passed.
var (
	initStartDelay  time.Duration
	ignoreLateTrust bool
)

// container is one exec step's init, as flowd holds it.
type container struct {
	mode Mode
	cmd  *exec.Cmd
	done chan struct{} // closed once the init has been reaped

	mu  sync.Mutex // serialises the control pipe's lines
	ctl *os.File   // the control pipe's write end; its close (or this process's death) is EOF

	started    chan startReport // one report: the command's start
	status     chan string      // the command's wait status, if the init reported one
	watchdog   atomic.Bool      // the init (or flowd, outside) stopped the step at its trust deadline
	outside    atomic.Bool      // flowd killed the step at its trust deadline: the init had not
	reportDone chan struct{}    // closed when the report has been read to its end
}

type startReport struct {
	pid int
	err error
}

// send writes one line to the init; errors mean the init is gone, which is what the
// line would have achieved.
func (c *container) send(format string, args ...any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ctl != nil {
		_, _ = fmt.Fprintf(c.ctl, format+"\n", args...)
	}
}

// stop asks the init for SIGTERM to every process of the step, SIGKILL a grace later.
func (c *container) stop(grace time.Duration) { c.send("stop %d", int64(grace)) }

// kill asks the init to SIGKILL every process of the step now. In a PID namespace the
// init itself is killed too, whatever state it is in: its death makes the kernel kill
// everything in it, and its parent's wait returns only once they are all gone. (In a
// user namespace the init's parent is the launcher: it is asked, with SIGTERM, to
// SIGKILL the init and wait for it.)
func (c *container) kill() {
	c.send("kill")
	switch c.mode {
	case ModePIDNamespace:
		_ = c.cmd.Process.Signal(syscall.SIGKILL) // a no-op once the init was reaped
	case ModeUserPIDNamespace:
		_ = c.cmd.Process.Signal(syscall.SIGTERM)
	}
}

// trust moves the step's deadline (the lease's trust window) to t.
func (c *container) trust(t time.Time) { c.send("trust %d", monotonicOf(t)) }

// closeControl closes the control pipe: the init kills the tree and exits.
func (c *container) closeControl() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ctl != nil {
		_ = c.ctl.Close()
		c.ctl = nil
	}
}

// monotonicNow reads CLOCK_MONOTONIC, which every process of the machine shares (Go's
// own monotonic readings are not exposed as numbers).
func monotonicNow() int64 {
	var ts syscall.Timespec
	_, _, _ = syscall.Syscall(syscall.SYS_CLOCK_GETTIME, 1 /* CLOCK_MONOTONIC */, uintptr(unsafe.Pointer(&ts)), 0)
	return ts.Nano()
}

// monotonicOf converts t to CLOCK_MONOTONIC. The clock is read before time.Until, so a
// pause between the two reads makes the deadline earlier, never later; and an absolute
// deadline stays right however late the line reaches the init (flowd frozen between
// computing and writing it), which a relative one would not.
func monotonicOf(t time.Time) int64 {
	now := monotonicNow()
	return now + int64(time.Until(t))
}

// initCommand is how the init is started in mode m: its argv and its attributes (the
// namespaces, and the parent-death signal where the kernel's kill of the namespace does
// the rest). A subreaper's init gets no parent-death signal: killed, it could not
// sweep; it sees its control pipe close instead when this process dies.
//
// A user namespace is made by a launcher in between (launchInUserNamespace): whoever
// clones a child into a new user namespace writes the child's uid and gid maps in
// /proc/CHILD, and flowd, not dumpable, cannot (its children's /proc files belong to
// root until they exec). The launcher is a fresh exec, dumpable, so it can; it starts the
// init in the namespaces, with its own parent-death signal, and waits for it.
func initCommand(m Mode, u *User) ([]string, *syscall.SysProcAttr) {
	a := &syscall.SysProcAttr{Setpgid: true}
	switch m {
	case ModePIDNamespace:
		// A mount namespace too, where the init mounts the namespace's own /proc.
		a.Cloneflags = syscall.CLONE_NEWPID | syscall.CLONE_NEWNS
		a.Pdeathsig = syscall.SIGKILL
	case ModeUserPIDNamespace:
		a.Pdeathsig = syscall.SIGKILL
		return append([]string{initArg0, launcherArg}, userNamespaceMaps(u)...), a
	}
	return []string{initArg0}, a
}

// launcherArg marks the launcher of an init in a user namespace (initCommand).
const launcherArg = "userns"

// userNamespaceMaps are the launcher's arguments: the uid map, the gid map, and whether
// the init may call setgroups. flowd's own user and group map to themselves (not to
// root: a step sees the ids it has outside); an --exec-user's ids too, which only a
// process with CAP_SETUID may write (root in a container that cannot make a PID
// namespace without a user namespace).
func userNamespaceMaps(u *User) []string {
	uids, gids := []int{os.Getuid()}, []int{os.Getgid()}
	setgroups := "deny"
	if u != nil {
		uids = appendNew(uids, int(u.UID))
		for _, g := range append([]uint32{u.GID}, u.Groups...) {
			gids = appendNew(gids, int(g))
		}
		setgroups = "allow"
	}
	return []string{idList(uids), idList(gids), setgroups}
}

func appendNew(ids []int, id int) []int {
	if slices.Contains(ids, id) {
		return ids
	}
	return append(ids, id)
}

func idList(ids []int) string {
	s := make([]string, len(ids))
	for i, id := range ids {
		s[i] = strconv.Itoa(id)
	}
	return strings.Join(s, ",")
}

// idMaps parses idList's form into identity maps.
func idMaps(list string) []syscall.SysProcIDMap {
	var m []syscall.SysProcIDMap
	for _, f := range strings.Split(list, ",") {
		if id, err := strconv.Atoi(f); err == nil {
			m = append(m, syscall.SysProcIDMap{ContainerID: id, HostID: id, Size: 1})
		}
	}
	return m
}

// probe finds the strongest mode this process can use, by starting the init in probe
// mode with each mode's namespaces. Root makes a PID namespace directly; others, and
// root in a container that may not, need a user namespace around it.
func probe() (Mode, string) {
	candidates := []Mode{ModeUserPIDNamespace}
	if os.Geteuid() == 0 {
		candidates = []Mode{ModePIDNamespace, ModeUserPIDNamespace}
	}
	var failed []string
	for _, m := range candidates {
		err := probeMode(m)
		if err == nil {
			why := "each step's processes run in a PID namespace of their own"
			if m == ModePIDNamespace {
				if privateProc.err == nil {
					why += ", with a /proc of their own (they see no other process)"
				} else {
					why += "; no /proc of their own could be mounted (" + privateProc.err.Error() + "): they see the host's processes"
				}
			}
			return m, why
		}
		failed = append(failed, fmt.Sprintf("%s: %v", m, err))
	}
	if err := probeMode(ModeSubreaper); err != nil {
		// No init at all (no /proc to find this program through): the command itself.
		return ModeProcessGroup, fmt.Sprintf("no step init could be started (%s; subreaper: %v): each step's command runs in a process group of its own", strings.Join(failed, "; "), err)
	}
	return ModeSubreaper, "no PID namespace could be made (" + strings.Join(failed, "; ") + "): each step's init is a child subreaper that kills every descendant"
}

// probeWait bounds a probe: the init answers as soon as it has read its spec.
const probeWait = 10 * time.Second

// privateProc is what the probe of pid-namespace mode found: whether the init could
// mount a /proc of the namespace's own (err nil), which every step's init then does.
var privateProc struct{ err error }

func probeMode(m Mode) error {
	c, _, err := startInit(m, &initSpec{Probe: true, Mode: m, PrivateProc: m == ModePIDNamespace}, nil, io.Discard, io.Discard)
	if err != nil {
		return err
	}
	defer c.closeControl()
	t := time.NewTimer(probeWait)
	defer t.Stop()
	select {
	case r := <-c.started:
		<-c.done
		<-c.reportDone
		return r.err
	case <-t.C:
		_ = c.cmd.Process.Kill()
		<-c.done
		<-c.reportDone
		return errors.New("the init did not answer")
	}
}

// startInit starts the step init in mode m, gives it spec, and returns the container
// and a channel that gets the init's Wait result. Its report is read by a goroutine
// that ends with the init.
func startInit(m Mode, spec *initSpec, stdin io.Reader, stdout, stderr io.Writer) (*container, <-chan error, error) {
	ctlR, ctlW, err := os.Pipe()
	if err != nil {
		return nil, nil, err
	}
	repR, repW, err := os.Pipe()
	if err != nil {
		ctlR.Close()
		ctlW.Close()
		return nil, nil, err
	}
	args, attr := initCommand(m, spec.User)
	cmd := &exec.Cmd{Path: "/proc/self/exe", Args: args, Env: initEnv,
		Stdin: stdin, Stdout: stdout, Stderr: stderr, ExtraFiles: []*os.File{ctlR, repW}, SysProcAttr: attr,
		// A process the init could not kill (another user's) may hold stdout open: Wait
		// does not wait for it longer than this once the init has exited.
		WaitDelay: time.Second}
	c := &container{mode: m, cmd: cmd, ctl: ctlW, done: make(chan struct{}), started: make(chan startReport, 1), status: make(chan string, 1),
		reportDone: make(chan struct{})}
	waited, err := start(cmd, func() { addContainer(c) })
	ctlR.Close() // the init's ends: this process keeps none, so the init's death is EOF here
	repW.Close()
	if err != nil {
		ctlW.Close()
		repR.Close()
		return nil, nil, err
	}
	out := make(chan error, 1)
	go func() {
		err := <-waited
		containerDone(c)
		close(c.done)
		out <- err
	}()
	go c.readReport(repR)
	line, _ := json.Marshal(spec)
	c.send("%s", line)
	return c, out, nil
}

// readReport reads the init's report until the init exits: its first line says whether
// the command started, a later "exit STATUS" how it ended.
func (c *container) readReport(r *os.File) {
	defer close(c.reportDone)
	defer r.Close()
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 4096), 64<<10)
	first := true
	for sc.Scan() {
		verb, arg, _ := strings.Cut(sc.Text(), " ")
		switch {
		case first && verb == "ok": // a probe's answer: "ok", or "ok noproc WHY" (no private /proc)
			if why, ok := strings.CutPrefix(arg, "noproc "); ok {
				privateProc.err = errors.New(why)
			}
			c.started <- startReport{}
			first = false
		case first && verb == "started":
			pid, _ := strconv.Atoi(arg)
			c.started <- startReport{pid: pid}
			first = false
		case first && verb == "failed":
			c.started <- startReport{err: errors.New(arg)}
			first = false
		case verb == "watchdog":
			c.watchdog.Store(true)
		case verb == "exit":
			select {
			case c.status <- arg:
			default:
			}
		}
	}
	if first {
		c.started <- startReport{err: errors.New("the step init exited before it started the command")}
	}
}

// waitStatusText is what os.ProcessState.String says of a wait status: "exit status 3",
// "signal: killed".
func waitStatusText(raw string) string {
	n, err := strconv.ParseUint(raw, 10, 32)
	if err != nil {
		return "unknown status " + raw
	}
	ws := syscall.WaitStatus(n)
	switch {
	case ws.Exited():
		return "exit status " + strconv.Itoa(ws.ExitStatus())
	case ws.Signaled():
		s := "signal: " + ws.Signal().String()
		if ws.CoreDump() {
			s += " (core dumped)"
		}
		return s
	}
	return "wait status " + raw
}

func waitStatusOK(raw string) bool {
	n, err := strconv.ParseUint(raw, 10, 32)
	return err == nil && syscall.WaitStatus(n).Exited() && syscall.WaitStatus(n).ExitStatus() == 0
}

// initLate is how long after a stop's grace flowd waits for the init before it kills
// the init itself: an init that has not ended by then was stopped or killed by the
// step (a subreaper's, by a step running as flowd's own user).
const initLate = time.Second

// runContained runs p under a step init in mode m.
func (p *process) runContained(ctx context.Context, m Mode) outcome {
	spec := &initSpec{Mode: m, Path: p.path, Args: p.args, Env: p.env, Dir: p.dir, User: p.user, Grace: p.grace,
		PrivateProc: m == ModePIDNamespace && privateProc.err == nil && p.user != nil, Dumpable: keepInitDumpable, SlowStart: initStartDelay, IgnoreLateTrust: ignoreLateTrust}
	var last time.Time
	trust := p.trust
	if noTrustDeadline != "" {
		trust = nil // the control: no deadline for the init, none watched by flowd
	}
	if trust != nil {
		if last = trust(); !last.IsZero() {
			spec.Trust = monotonicOf(last)
		}
	}
	c, waited, err := startInit(m, spec, p.stdin, p.stdout, p.stderr)
	if err != nil {
		return outcome{start: fmt.Errorf("the step init: %w", err)}
	}
	defer c.closeControl()
	// The deadline is watched from the init's start, not from its report that the
	// command started: a command can freeze its init (a step of the init's own user)
	// before the init has written that report.
	stopTrust := make(chan struct{})
	trustDone := make(chan struct{})
	go func() {
		defer close(trustDone)
		c.forwardTrust(trust, last, p.grace, stopTrust)
	}()
	defer func() { close(stopTrust); <-trustDone }()
	var r startReport
	select {
	case r = <-c.started:
	case <-ctx.Done():
		// Stopped before the init said the command started (it may have, and the
		// init may be frozen): no grace to give, kill the step.
		c.killTree(stopTrust)
		<-waited
		<-c.reportDone
		return outcome{stopped: true}
	}
	if r.err != nil {
		c.closeControl()
		<-waited
		<-c.reportDone
		if c.outside.Load() { // flowd killed it at the deadline: its command had started
			return outcome{exit: fmt.Errorf("killed by flowd, its init had not stopped it (%w)", ErrTrustDeadline)}
		}
		return outcome{start: r.err}
	}
	var werr error
	select {
	case werr = <-waited:
	case <-ctx.Done():
		c.stop(p.grace)
		t := time.NewTimer(p.grace + initLate)
		select {
		case <-waited:
		case <-t.C:
			c.kill()
			t.Reset(initLate)
			select {
			case <-waited:
			case <-t.C:
				_ = c.cmd.Process.Kill()
				<-waited
			}
		}
		t.Stop()
		<-c.reportDone // at hand: the init has exited, and with it the report's only writer
		return outcome{stopped: true}
	}
	<-c.reportDone
	select {
	case st := <-c.status:
		if waitStatusOK(st) {
			return outcome{}
		}
		err := errors.New(waitStatusText(st))
		if c.watchdog.Load() {
			err = fmt.Errorf("%w (%w)", err, ErrTrustDeadline)
		}
		return outcome{exit: err}
	default:
		if c.outside.Load() {
			return outcome{exit: fmt.Errorf("killed by flowd, its init had not stopped it (%w)", ErrTrustDeadline)}
		}
		return outcome{exit: fmt.Errorf("the step init ended without the command's status: %v", werr)}
	}
}

// forwardTrust tells the init each new trust deadline (a renewal of the lease), until
// stop. It reads trust at a quarter of the time left, so a renewal reaches the init
// long before the deadline it replaces (a renewal comes a third of the TTL before).
//
// It is also the watchdog outside the step's reach: the init stops the step at the
// deadline (SIGTERM, SIGKILL a grace later), and if the init has not ended by the
// deadline, the grace and a little more (outsideSlack), flowd kills the step itself
// (outsideKill): a step that stopped its init (ptrace, SIGSTOP where it may), or starved
// it of the CPU, is killed all the same. Once a deadline has passed it is not moved
// again (the init, whose copy has fired, would not move it either).
func (c *container) forwardTrust(trust func() time.Time, last time.Time, grace time.Duration, stop <-chan struct{}) {
	if trust == nil {
		return
	}
	for {
		wait := time.Second
		now := time.Now()
		switch {
		case !last.IsZero() && !now.Before(last):
			// Passed: the init is stopping the step; flowd kills it if it has not.
			at := last.Add(grace + outsideSlack(grace))
			if !now.Before(at) {
				if !noOutsideWatchdog {
					c.outsideKill(stop)
				}
				return
			}
			wait = at.Sub(now)
		default:
			if d := trust(); !d.IsZero() {
				if !d.Equal(last) {
					c.trust(d)
					last = d
				}
				wait = min(max(time.Until(d)/4, 10*time.Millisecond), time.Second)
			}
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-stop:
			t.Stop()
			return
		case <-c.done:
			t.Stop()
			return
		}
	}
}

// outsideSlack is how long after the init's own SIGKILL (the deadline and the grace)
// flowd waits before it kills the step itself: a quarter of the grace, within 20ms and
// 500ms. The engine's grace is TTL/4 and the lease can move TTL/3 after the deadline,
// so flowd's kill (TTL/4 + TTL/16) still lands before it can (docs/security.md).
func outsideSlack(grace time.Duration) time.Duration {
	return min(max(grace/4, 20*time.Millisecond), 500*time.Millisecond)
}

// outsideKill is flowd's own kill of a step whose init did not stop it at its trust
// deadline. In a PID namespace the init is killed (SIGKILL from flowd; in a user
// namespace the launcher does it, which the step cannot reach either), and the kernel
// kills the rest; the launcher itself is killed if it has not ended a second later. As
// a subreaper, flowd sweeps the init's descendants itself, then kills the init.
func (c *container) outsideKill(stop <-chan struct{}) {
	c.outside.Store(true)
	c.watchdog.Store(true)
	c.killTree(stop)
}

// killTree kills every process of the step from flowd, whatever state its init is in
// (outsideKill says how in each mode), and returns once the init has ended or, in a
// namespace, after initLate and a SIGKILL of the init's own process (or stop).
func (c *container) killTree(stop <-chan struct{}) {
	switch c.mode {
	case ModeSubreaper:
		(&tree{mode: ModeSubreaper, self: c.cmd.Process.Pid}).killAll()
		_ = c.cmd.Process.Signal(syscall.SIGKILL)
		return
	default:
		c.kill()
	}
	t := time.NewTimer(initLate)
	defer t.Stop()
	select {
	case <-c.done:
	case <-stop:
	case <-t.C:
		_ = c.cmd.Process.Signal(syscall.SIGKILL)
	}
}
