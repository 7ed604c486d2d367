package steps

import (
	"sync"
	"syscall"
	"time"
)

// Mode is how an exec step's process tree is bound to its attempt: what ends every
// process the command started, however it was forked, when the step stops.
// docs/security.md says what each mode covers and what it does not.
type Mode string

// The containment modes, strongest first.
const (
	// ModePIDNamespace: each step runs in a PID namespace of its own, under a small init
	// (PID 1 there). When the init ends, the kernel kills every process in the
	// namespace; nothing in it can leave. flowd running as root. A step running as
	// another user (flowd's default nobody, --exec-user) also gets a mount namespace
	// with a /proc of its own, where it sees no other process.
	ModePIDNamespace Mode = "pid-namespace"
	// ModeUserPIDNamespace is ModePIDNamespace inside a user namespace that maps
	// flowd's own user to itself: how a PID namespace is made without root, where the
	// kernel allows unprivileged user namespaces.
	ModeUserPIDNamespace Mode = "user-pid-namespace"
	// ModeSubreaper: no namespace; the init is a child subreaper, so processes that
	// leave the command (setsid, double fork) stay its descendants, and it kills all of
	// them, repeatedly, until none is left. A step running as flowd's own user can kill
	// its init and escape; processes under another user cannot be killed.
	ModeSubreaper Mode = "subreaper"
	// ModeProcessGroup: no containment (the link-time switch, or a system other than
	// Linux): the command's process group is signalled and the command gets the
	// parent-death signal; what leaves the group (setsid) escapes.
	ModeProcessGroup Mode = "process-group"
)

// containment is empty in every build but the negative controls and the tests of the
// fallback: -ldflags "-X github.com/flowrun/flow/steps.containment=off" runs exec steps
// as before the step init (a process group and the parent-death signal,
// ModeProcessGroup), and containment=subreaper skips the namespace (ModeSubreaper) where
// one could be made.
var containment string

// noTrustDeadline is empty in every build but one negative control: -ldflags "-X
// github.com/flowrun/flow/steps.noTrustDeadline=1" runs exec steps contained as ever
// but gives their init no trust deadline (none at the start, no renewals forwarded, no
// watchdog of flowd's own), so that the trust deadline's control switches off that
// guard alone (clustertest TestFrozenOwnersStepsStopBeforeTheTakeover).
var noTrustDeadline string

var probed struct {
	once sync.Once
	mode Mode
	why  string
}

// Containment is the containment exec steps get in this process. It is found once, by
// starting the step init with each mode's namespaces until one works (a few
// milliseconds), and never changes after. flowd logs it at start and exports it as the
// metric flow_step_containment{mode}.
func Containment() Mode {
	m, _ := containmentWhy()
	return m
}

// ContainmentNote says, in a sentence, why Containment is what it is (what the probe
// met), for flowd's start-up log.
func ContainmentNote() string {
	_, why := containmentWhy()
	return why
}

func containmentWhy() (Mode, string) {
	probed.once.Do(func() {
		switch containment {
		case "off":
			probed.mode, probed.why = ModeProcessGroup, "containment switched off at link time (steps.containment=off)"
		case "subreaper":
			probed.mode, probed.why = ModeSubreaper, "namespaces skipped at link time (steps.containment=subreaper)"
		default:
			probed.mode, probed.why = probe()
		}
	})
	return probed.mode, probed.why
}

// live is every exec step running in this process: the containers (their inits) and,
// with containment off, the process groups. It is process-wide on purpose: its one
// reader is the poison pill, which ends the whole process, every engine in it
// included, and must take their steps with it.
var live struct {
	sync.Mutex
	containers map[*container]struct{}
	groups     map[int]struct{}
}

func addGroup(pgid int) {
	live.Lock()
	defer live.Unlock()
	if live.groups == nil {
		live.groups = map[int]struct{}{}
	}
	live.groups[pgid] = struct{}{}
}

// groupDone kills whatever is left of a step's process group and forgets it.
func groupDone(pgid int) {
	live.Lock()
	defer live.Unlock()
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	delete(live.groups, pgid)
}

func addContainer(c *container) {
	live.Lock()
	defer live.Unlock()
	if live.containers == nil {
		live.containers = map[*container]struct{}{}
	}
	live.containers[c] = struct{}{}
}

func containerDone(c *container) {
	live.Lock()
	defer live.Unlock()
	delete(live.containers, c)
}

// killWait bounds how long KillProcessGroups waits for the steps' inits to report
// their trees dead.
const killWait = 2 * time.Second

// KillProcessGroups kills every exec step still running in this process, with all the
// processes each started, and returns how many steps it killed. The poison pill calls
// it before it exits. With containment, each step's init is told to kill its tree (and
// in a PID namespace the init itself is killed, which makes the kernel kill the rest);
// the call returns once the inits have exited, or after a bound (2s). Without
// containment, each step's process group gets SIGKILL.
func KillProcessGroups() int {
	live.Lock()
	n := len(live.groups) + len(live.containers)
	for pgid := range live.groups {
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
	}
	var waits []<-chan struct{}
	for c := range live.containers {
		c.kill()
		waits = append(waits, c.done)
	}
	live.Unlock()
	t := time.NewTimer(killWait)
	defer t.Stop()
	for _, w := range waits {
		select {
		case <-w:
		case <-t.C:
			return n
		}
	}
	return n
}
