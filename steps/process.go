package steps

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// process is one exec step's command, ready to run.
type process struct {
	path   string   // the program, resolved
	args   []string // argv, args[0] as written
	env    []string
	dir    string
	user   *User
	stdin  io.Reader
	stdout io.Writer
	stderr io.Writer
	grace  time.Duration    // SIGTERM to SIGKILL
	trust  func() time.Time // Input.TrustUntil
}

// outcome is how a process ended: it could not start, it was stopped (its context
// ended), or it exited (exit is nil for status 0).
type outcome struct {
	start   error
	stopped bool
	exit    error
}

// run runs p in mode m until it ends or ctx ends.
func (p *process) run(ctx context.Context, m Mode) outcome {
	if m == ModeProcessGroup {
		return p.runGroup(ctx)
	}
	return p.runContained(ctx, m)
}

// runGroup runs p without containment (ModeProcessGroup, as before the step init): in its
// own process group, which is sent SIGTERM when ctx ends and SIGKILL a grace later, and
// SIGKILL again when the command has exited, for what it left in the group.
func (p *process) runGroup(ctx context.Context) outcome {
	cmd := &exec.Cmd{Path: p.path, Args: p.args, Env: p.env, Dir: p.dir, Stdin: p.stdin, Stdout: p.stdout, Stderr: p.stderr,
		SysProcAttr: procAttr(p.user),
		// What the command left running (outside its group) may hold stdout open: the
		// step does not wait for it longer than this once the command has exited.
		WaitDelay: time.Second}
	waited, err := start(cmd, func() { addGroup(cmd.Process.Pid) }) // Setpgid: its pid is its group's id
	if err != nil {
		return outcome{start: err}
	}
	pgid := cmd.Process.Pid
	defer groupDone(pgid)
	select {
	case err = <-waited:
	case <-ctx.Done():
		_ = syscall.Kill(-pgid, syscall.SIGTERM)
		t := time.NewTimer(p.grace)
		select {
		case <-waited:
		case <-t.C:
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
			<-waited
		}
		t.Stop()
		return outcome{stopped: true}
	}
	if errors.Is(err, exec.ErrWaitDelay) {
		err = nil // the command succeeded; what it left behind held stdout open
	}
	return outcome{exit: err}
}

// programPath is the program the command names. A bare name is looked up in this
// process's PATH, as before. A relative path is this process's working directory's
// when the step gives no `dir` (it did before the step got a fresh one), and the
// step's `dir`'s when it gives one.
func programPath(name string, dirGiven bool) (string, error) {
	if !strings.Contains(name, "/") {
		return exec.LookPath(name)
	}
	if filepath.IsAbs(name) || dirGiven {
		return name, nil
	}
	return filepath.Abs(name)
}

// workDirPrefix starts the name of every step's working directory, followed by the PID
// of the process that made it: RemoveStaleWorkDirs finds those of processes that died.
const workDirPrefix = "flow-step-"

// workDir makes a step's fresh working directory: empty, 0700, the step's user's. It is
// made in this process's TMPDIR, or, when the step's user could not reach that (a
// TMPDIR inside flowd's 0700 data dir), in /tmp.
func workDir(u *User) (string, error) {
	base := workDirBase(u)
	if u != nil && !reachableBy(base, u) {
		return "", fmt.Errorf("a working directory: user %s may not enter %s nor /tmp: set TMPDIR to a directory it may", u.Name, os.TempDir())
	}
	dir, err := os.MkdirTemp(base, workDirPrefix+strconv.Itoa(os.Getpid())+"-")
	if err != nil {
		return "", fmt.Errorf("a working directory: %w (is TMPDIR writable?)", err)
	}
	if u != nil {
		if err := os.Chown(dir, int(u.UID), int(u.GID)); err != nil {
			_ = os.Remove(dir)
			return "", fmt.Errorf("a working directory for user %s: %w", u.Name, err)
		}
	}
	return dir, nil
}

// workDirBase is where a step running as u gets its working directory: TMPDIR, or /tmp
// if u may not reach TMPDIR.
func workDirBase(u *User) string {
	tmp := os.TempDir()
	if u == nil || reachableBy(tmp, u) || !reachableBy("/tmp", u) {
		return tmp
	}
	return "/tmp"
}

// reachableBy reports whether u may enter dir: search permission on it and on every
// directory above it, by the mode bits (owner, group, others) that apply to u.
func reachableBy(dir string, u *User) bool {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return false
	}
	for p := abs; ; p = filepath.Dir(p) {
		st, err := os.Stat(p)
		if err != nil {
			return false
		}
		sys, ok := st.Sys().(*syscall.Stat_t)
		if !ok {
			return false
		}
		perm := st.Mode().Perm()
		var x fs.FileMode = 0o001
		switch {
		case sys.Uid == u.UID:
			x = 0o100
		case sys.Gid == u.GID || slices.Contains(u.Groups, sys.Gid):
			x = 0o010
		}
		if perm&x == 0 {
			return false
		}
		if p == filepath.Dir(p) {
			return true
		}
	}
}

// removeWorkDir removes a step's working directory and what the step left in it,
// including directories it made unwritable.
func removeWorkDir(dir string, log *slog.Logger) {
	err := os.RemoveAll(dir)
	for range 3 { // each pass opens one more level of directories made unreadable
		if err == nil || !errors.Is(err, fs.ErrPermission) {
			break
		}
		// Directories only: WalkDir does not follow symbolic links, and every process of
		// the step is dead, so none can swap a directory for a link now.
		_ = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
			if (err == nil && d.IsDir()) || errors.Is(err, fs.ErrPermission) {
				_ = os.Chmod(path, 0o700)
			}
			return nil
		})
		err = os.RemoveAll(dir)
	}
	if err != nil && log != nil {
		log.Warn("exec: the step's working directory could not be removed", "dir", dir, "err", err)
	}
}

// RemoveStaleWorkDirs removes the working directories that exec steps of processes
// no longer running left behind (a flowd that was SIGKILLed could not remove its
// running steps'), and returns how many it removed. flowd calls it at start. Only
// directories in this process's TMPDIR (and in /tmp, where u's steps get theirs when
// u may not reach TMPDIR) named by a dead process, and owned by this
// process's user or by u (--exec-user), are removed.
func RemoveStaleWorkDirs(u *User) (int, error) {
	n, err := removeStaleIn(os.TempDir(), u)
	if base := workDirBase(u); base != os.TempDir() {
		m, err2 := removeStaleIn(base, u)
		n += m
		err = errors.Join(err, err2)
	}
	return n, err
}

func removeStaleIn(tmp string, u *User) (int, error) {
	entries, err := os.ReadDir(tmp)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, e := range entries {
		rest, ok := strings.CutPrefix(e.Name(), workDirPrefix)
		pidText, _, ok2 := strings.Cut(rest, "-")
		pid, err := strconv.Atoi(pidText)
		if !ok || !ok2 || err != nil || pid <= 0 || !e.IsDir() || processExists(pid) {
			continue
		}
		path := filepath.Join(tmp, e.Name())
		if !ownedBy(path, os.Geteuid(), u) {
			continue
		}
		removeWorkDir(path, nil)
		if _, err := os.Lstat(path); os.IsNotExist(err) {
			n++
		}
	}
	return n, nil
}

// processExists reports whether a process pid exists (or may: EPERM).
func processExists(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// ownedBy reports whether path (not followed) belongs to uid or to u.
func ownedBy(path string, uid int, u *User) bool {
	st, err := os.Lstat(path)
	if err != nil || !st.IsDir() {
		return false
	}
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !ok {
		return false
	}
	return int(sys.Uid) == uid || (u != nil && sys.Uid == u.UID)
}
