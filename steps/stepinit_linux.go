package steps

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// A program that links this package and is started as initArg0 is a step init: it runs
// the init and exits before any main. (Package initialisation runs dependencies first;
// what the init uses is initialised by then.)
func init() {
	switch {
	case len(os.Args) == 1 && os.Args[0] == initArg0:
		os.Exit(stepInit())
	case len(os.Args) == 5 && os.Args[0] == initArg0 && os.Args[1] == launcherArg:
		os.Exit(launchInUserNamespace(os.Args[2], os.Args[3], os.Args[4] == "allow"))
	}
}

// launchInUserNamespace starts the init in a new user and PID namespace, with the
// given identity maps, passes it this process's files (0-4) and waits for it
// (initCommand says why a launcher does it and not flowd). If this process dies (flowd
// died: the launcher has its parent-death signal), the init gets SIGKILL from the
// kernel too, and the namespace goes with it.
func launchInUserNamespace(uids, gids string, setgroups bool) int {
	runtime.LockOSThread() // the init's parent-death signal follows this thread
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, syscall.SIGHUP, syscall.SIGINT, syscall.SIGQUIT, syscall.SIGTERM, syscall.SIGUSR1,
		syscall.SIGUSR2, syscall.SIGPIPE, syscall.SIGALRM, syscall.SIGTSTP, syscall.SIGTTIN, syscall.SIGTTOU)
	pid, err := syscall.ForkExec("/proc/self/exe", []string{initArg0}, &syscall.ProcAttr{Env: initEnv, Files: []uintptr{0, 1, 2, initControlFD, initReportFD},
		Sys: &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWUSER | syscall.CLONE_NEWPID, UidMappings: idMaps(uids), GidMappings: idMaps(gids),
			GidMappingsEnableSetgroups: setgroups, Pdeathsig: syscall.SIGKILL}})
	if err != nil {
		_, _ = fmt.Fprintf(os.NewFile(initReportFD, "report"), "failed cannot make a user and PID namespace: %v\n", err)
		return 2
	}
	// The init has its maps (written before ForkExec returned): from now on nothing may
	// read or trace this process (the step cannot name it from inside its namespace
	// anyway). Before the fork it could not be: the init's /proc files would have been
	// root's, and its maps unwritable.
	_ = setDumpable(false)
	// The init holds the pipes now: flowd's end of the report sees EOF when it exits.
	_ = syscall.Close(initControlFD)
	_ = syscall.Close(initReportFD)
	go func() {
		for s := range sigs {
			if s == syscall.SIGTERM { // flowd's kill (container.kill): nothing inside the namespace can send it
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	}()
	for {
		var ws syscall.WaitStatus
		_, err := syscall.Wait4(pid, &ws, 0, nil)
		if err == syscall.EINTR {
			continue
		}
		switch {
		case err != nil:
			return 1
		case ws.Signaled(): // end the same way, so flowd's error says how the init ended
			signal.Reset(ws.Signal())
			_ = syscall.Kill(os.Getpid(), ws.Signal())
			return 128 + int(ws.Signal())
		}
		return ws.ExitStatus()
	}
}

// prctl(2)
const (
	prSetDumpable       = 4
	prSetChildSubreaper = 36
)

// setDumpable sets this process's dumpable flag (prctl PR_SET_DUMPABLE): 0 makes its
// /proc/PID files root's and closes it to ptrace by anyone without CAP_SYS_PTRACE in its
// user namespace.
func setDumpable(on bool) error {
	v := uintptr(0)
	if on {
		v = 1
	}
	if _, _, e := syscall.RawSyscall(syscall.SYS_PRCTL, prSetDumpable, v, 0); e != 0 {
		return e
	}
	return nil
}

// mountPrivateProc mounts, in the init's own mount namespace (pid-namespace mode:
// CLONE_NEWNS), a /proc of its PID namespace over the host's: the step sees its own
// processes only, not flowd's nor any other's, command lines included. Mounts are made
// private first, so that nothing of this propagates to the host's namespace.
func mountPrivateProc() error {
	if err := syscall.Mount("", "/", "", syscall.MS_REC|syscall.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("making mounts private: %w", err)
	}
	if err := syscall.Mount("proc", "/proc", "proc", syscall.MS_NOSUID|syscall.MS_NODEV|syscall.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mount proc: %w", err)
	}
	return nil
}

// The init's limits. sweepGiveUp: after the command exited and the tree was killed, how
// long the init waits for processes it cannot kill (another user's) before it exits
// and leaves them (subreaper mode; a namespace's are killed by the kernel at the
// init's exit). sweepPause: between sweeps of /proc while processes die.
const (
	sweepGiveUp = 2 * time.Second
	sweepPause  = 2 * time.Millisecond
)

// stepInit is the init's whole life. It reads its spec from the control pipe, starts
// the command, reaps every process that ends up its child, and:
//   - when the command exits: reports its status, kills what is left, exits;
//   - "stop GRACE": SIGTERM to every process of the step, SIGKILL a grace later;
//   - "kill", or EOF on the control pipe (flowd died, or gave up on it): SIGKILL all;
//   - "trust T": the step's deadline moves to T (CLOCK_MONOTONIC);
//   - the deadline passes with no extension (flowd is frozen while its lease lapses):
//     stop, as above, with the spec's grace.
//
// In a PID namespace it is PID 1: kill(-1) reaches exactly the namespace, and its own
// exit makes the kernel kill whatever is left. As a subreaper, every orphan of the
// tree becomes its child, and it sweeps /proc for its descendants until none is left.
func stepInit() int {
	runtime.LockOSThread() // the command's parent-death signal follows this thread
	syscall.CloseOnExec(initControlFD)
	syscall.CloseOnExec(initReportFD)
	ctl := os.NewFile(initControlFD, "control")
	rep := os.NewFile(initReportFD, "report")
	report := func(format string, args ...any) { _, _ = fmt.Fprintf(rep, format+"\n", args...) }
	rd := bufio.NewReaderSize(ctl, 64<<10)
	line, err := rd.ReadBytes('\n')
	var spec initSpec
	if err != nil || json.Unmarshal(line, &spec) != nil {
		return 2
	}
	// Not dumpable, before the command exists: a step running as the init's own user
	// (flowd's, in user-pid-namespace and subreaper modes) may not ptrace it (and so
	// freeze it past the trust deadline, docs/security.md), nor read its memory; in a
	// user namespace of the init's, the step has no CAP_SYS_PTRACE that would override
	// it. The command is dumpable again once it has exec'd.
	if !spec.Dumpable {
		if err := setDumpable(false); err != nil {
			report("failed cannot make the step init not dumpable: %v", err)
			return 2
		}
	}
	if spec.PrivateProc {
		if err := mountPrivateProc(); err != nil {
			if spec.Probe {
				report("ok noproc %v", err)
				return 0
			}
			report("failed cannot mount the step's own /proc: %v", err)
			return 2
		}
	}
	if spec.Probe {
		report("ok")
		return 0
	}
	// Signals the step sends its init are not its business: handled (and dropped), so
	// that none stops or ends it; handled, not ignored, so the command does not inherit
	// them ignored.
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, syscall.SIGHUP, syscall.SIGINT, syscall.SIGQUIT, syscall.SIGTERM, syscall.SIGUSR1,
		syscall.SIGUSR2, syscall.SIGPIPE, syscall.SIGALRM, syscall.SIGTSTP, syscall.SIGTTIN, syscall.SIGTTOU)
	tree := newTree(spec.Mode)
	if spec.Mode == ModeSubreaper {
		if _, _, e := syscall.RawSyscall(syscall.SYS_PRCTL, prSetChildSubreaper, 1, 0); e != 0 {
			report("failed cannot become a child subreaper: %v", e)
			return 2
		}
	}
	if spec.SlowStart > 0 {
		time.Sleep(spec.SlowStart) // the tests' starved init (initSpec.SlowStart)
	}
	pid, err := syscall.ForkExec(spec.Path, spec.Args, &syscall.ProcAttr{Dir: spec.Dir, Env: spec.Env, Files: []uintptr{0, 1, 2},
		Sys: &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL, Credential: spec.User.credential()}})
	if err != nil {
		report("failed %v", err)
		return 127
	}
	report("started %d", pid)

	reaped := make(chan reapedChild, 64)
	empty := make(chan struct{}) // closed when the init has no child left
	go reap(reaped, empty)
	msgs := make(chan string, 16)
	var unread atomic.Int64 // bytes the reader holds and has not sent on msgs
	// The spec's read may have taken the lines flowd wrote after it (a renewal, while
	// this init was starting) into rd's buffer.
	unread.Store(int64(rd.Buffered()))
	go func() {
		defer close(msgs)
		for {
			l, err := rd.ReadString('\n')
			unread.Store(int64(rd.Buffered() + len(l)))
			if err != nil {
				unread.Store(0)
				return
			}
			msgs <- strings.TrimSpace(l)
			unread.Store(int64(rd.Buffered()))
		}
	}()

	deadline := newDeadline(spec.Trust)
	defer deadline.Stop()
	var killAt <-chan time.Time // after a stop's grace
	var giveUp <-chan time.Time // after the command exited and the rest was killed
	ending := false             // the command has exited
	handle := func(m string, ok bool) {
		verb, arg, _ := strings.Cut(m, " ")
		switch {
		case !ok, verb == "kill":
			msgs = nil
			tree.killAll()
			if !ending {
				giveUp = time.After(sweepGiveUp)
			}
			ending = true
		case verb == "stop" && killAt == nil:
			g, _ := strconv.ParseInt(arg, 10, 64)
			tree.signalAll(syscall.SIGTERM)
			killAt = time.After(time.Duration(g))
		case verb == "trust":
			t, _ := strconv.ParseInt(arg, 10, 64)
			deadline.Move(t)
		}
	}
	for {
		select {
		case r := <-reaped:
			if r.pid != pid {
				continue
			}
			report("exit %d", uint32(r.status))
			ending = true
			tree.killAll()
			giveUp = time.After(sweepGiveUp)
		case <-empty:
			// The reaper sent every child it reaped before it found none left: the
			// command's status may still be queued.
			for {
				select {
				case r := <-reaped:
					if r.pid == pid {
						report("exit %d", uint32(r.status))
					}
					continue
				default:
				}
				return 0
			}
		case m, ok := <-msgs:
			handle(m, ok)
		case <-deadline.C():
			if !spec.IgnoreLateTrust && lateTrust(&unread, msgs, handle) && deadline.at > monotonicNow() {
				continue // flowd moved the deadline before it passed; this init read it late
			}
			deadline.fired = true
			report("watchdog")
			if killAt == nil {
				tree.signalAll(syscall.SIGTERM)
				killAt = time.After(spec.Grace)
			}
		case <-killAt:
			tree.killAll()
		case <-giveUp:
			// Only processes it cannot kill are left (or, in a namespace, ones the kernel
			// kills as this init exits).
			return 0
		case <-sigs:
		}
	}
}

// lateTrustWait bounds how long the init waits, at its deadline, for a control line
// already in the pipe to reach its loop (the reader holds it, or has yet to read it).
const lateTrustWait = 100 * time.Millisecond

// lateTrust handles, when the deadline fires, every control line flowd wrote before it:
// an init starved of the CPU (or slow to start) can find its deadline passed with the
// renewal that moved it still unread in the pipe, sent by flowd before the deadline it
// replaces (forwardTrust moves no deadline that has passed). Stopping the step then
// would be safe, and wrong for liveness: on a loaded machine every step of a node could
// be stopped at a deadline its lease had long moved. Only flowd writes the pipe (the
// command does not inherit it), and a frozen flowd writes nothing, so a step whose
// renewals stopped is still stopped at its deadline. It reports whether it handled any.
func lateTrust(unread *atomic.Int64, msgs <-chan string, handle func(string, bool)) bool {
	handled := false
	for msgs != nil && (len(msgs) > 0 || unread.Load() > 0 || pipeUnread(initControlFD) > 0) {
		t := time.NewTimer(lateTrustWait)
		select {
		case m, ok := <-msgs:
			t.Stop()
			handle(m, ok)
			handled = true
			if !ok {
				return handled
			}
		case <-t.C:
			return handled
		}
	}
	return handled
}

// pipeUnread is how many bytes wait in the pipe fd (0 when it cannot tell).
func pipeUnread(fd int) int {
	n, err := unix.IoctlGetInt(fd, unix.TIOCINQ) // FIONREAD, for a pipe too
	if err != nil {
		return 0
	}
	return n
}

type reapedChild struct {
	pid    int
	status syscall.WaitStatus
}

// reap waits for any child until none is left. Orphans of the tree are the init's
// children (PID 1 of a namespace, or a subreaper), so none is left a zombie, and "no
// child" means no process of the step is left.
func reap(out chan<- reapedChild, empty chan<- struct{}) {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, 0, nil)
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			close(empty)
			return
		}
		out <- reapedChild{pid, ws}
	}
}

// deadline is the step's trust deadline on CLOCK_MONOTONIC (0: none).
type deadline struct {
	t     *time.Timer
	at    int64
	fired bool
}

func newDeadline(at int64) *deadline {
	d := &deadline{t: time.NewTimer(time.Hour)}
	d.t.Stop()
	d.Move(at)
	return d
}

// Move sets the deadline to at (never back to none once set).
func (d *deadline) Move(at int64) {
	if at == 0 || d.fired {
		return
	}
	d.at = at
	d.t.Reset(time.Duration(at - monotonicNow()))
}

func (d *deadline) C() <-chan time.Time {
	if d.fired {
		return nil
	}
	return d.t.C
}

func (d *deadline) Stop() { d.t.Stop() }

// tree is every process of the step but the init.
type tree struct {
	mode Mode
	self int
}

func newTree(m Mode) *tree { return &tree{mode: m, self: os.Getpid()} }

func (t *tree) inNamespace() bool {
	return t.mode == ModePIDNamespace || t.mode == ModeUserPIDNamespace
}

// signalAll sends sig to every process of the step once.
func (t *tree) signalAll(sig syscall.Signal) {
	if t.inNamespace() {
		_ = syscall.Kill(-1, sig) // every process of the namespace but its init
		return
	}
	for _, pid := range descendants(t.self) {
		_ = syscall.Kill(pid, sig)
	}
}

// killAll SIGKILLs every process of the step. In a namespace one kill(-1) does it (the
// kernel lets no process fork once it has a fatal signal pending). As a subreaper it
// sweeps: every descendant found in /proc is killed, and /proc read again, until none
// is alive or only ones it may not signal are left; a process that forks between the
// read and the kill is found in the next sweep (its parent is dead, so it is the
// init's child now).
func (t *tree) killAll() {
	if t.inNamespace() {
		_ = syscall.Kill(-1, syscall.SIGKILL)
		return
	}
	deadline := time.Now().Add(sweepGiveUp)
	for time.Now().Before(deadline) {
		left := descendants(t.self)
		if len(left) == 0 {
			return
		}
		killed := 0
		for _, pid := range left {
			if syscall.Kill(pid, syscall.SIGKILL) == nil {
				killed++
			}
		}
		if killed == 0 {
			return // only processes it may not signal
		}
		time.Sleep(sweepPause) // the killed are dying: read /proc again after a moment
	}
}

// descendants lists the live (not zombie) descendants of root, from /proc.
func descendants(root int) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	children := map[int][]int{}
	zombie := map[int]bool{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces and parentheses.
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 || i+2 >= len(s) {
			continue
		}
		f := strings.Fields(s[i+2:])
		if len(f) < 2 {
			continue
		}
		ppid, _ := strconv.Atoi(f[1])
		children[ppid] = append(children[ppid], pid)
		zombie[pid] = f[0] == "Z" || f[0] == "X"
	}
	var out []int
	queue := []int{root}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, c := range children[p] {
			if !zombie[c] {
				out = append(out, c)
			}
			queue = append(queue, c)
		}
	}
	return out
}
