package checkpoint

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Child runs (wait.go's child waits): a child's submit adopted by its parent, its end
// counted there, a cancel cascaded, and the IDs that bind a child to its parent.

// adopt records a child run's submit on its parent. The submit is the parent's: written
// with the parent's current epoch (epoch > 0), it is judged like the parent's commits: the
// parent running in that epoch, so a zombie of an older epoch starts no child (a submit
// without an epoch was written before children were fenced and is judged as then). The
// parent must exist and not have ended; the child's depth stays within MaxDepth; no
// ancestor runs the child's workflow (a loop of workflows, however it was applied); and
// the tree the child joins (its root and every descendant) stays within maxTree runs
// (the child's submit carries the bound of the node that started it; 0: none).
func (tx *applyBatch) adopt(child *Run, ref *ParentRef, epoch int64, maxTree int) error {
	p, err := tx.load(ref.Run)
	if err != nil {
		return err
	}
	if p == nil {
		return fmt.Errorf("%w: parent run %q of %s", ErrNotFound, ref.Run, child.ID)
	}
	switch {
	case p.run.Status.Terminal():
		return fmt.Errorf("%w: parent run %s has ended (%s): it starts no child", ErrConflict, ref.Run, p.run.Status)
	case epoch > 0 && !tx.s.hooks.NoChildEpochCheck && (p.run.Status != StatusRunning || p.run.Epoch != epoch):
		return &FencedError{Run: ref.Run, Step: ref.Step, Item: ref.Item, Epoch: epoch, CurrentEpoch: p.run.Epoch,
			Reason: fmt.Sprintf("stale-epoch: only the parent's current epoch starts its child %s (the parent is %s)", child.ID, p.run.Status), Seq: tx.seq}
	case p.run.Depth+1 > MaxDepth:
		return fmt.Errorf("%w: run %s would nest %d deep, more than %d (a loop of workflows?)", ErrConflict, child.ID, p.run.Depth+1, MaxDepth)
	case len(p.run.Children) >= MaxChildren:
		return fmt.Errorf("%w: parent run %s has %d children, the most it keeps", ErrConflict, ref.Run, MaxChildren)
	}
	if _, ok := p.steps[ref.Step]; !ok {
		return fmt.Errorf("%w: parent run %s has no step %q", ErrInvalidEntry, ref.Run, ref.Step)
	}
	// The ancestors, up to the root: a child of a workflow one of them runs closes a loop.
	root, path := p, []string{p.run.Workflow}
	for depth := 0; ; depth++ {
		if root.run.Workflow == child.Workflow && !tx.s.hooks.NoChildLoopCheck {
			chain := slices.Clone(path)
			slices.Reverse(chain)
			return fmt.Errorf("%w: run %s of workflow %s would start a run of %s, which an ancestor runs (%s -> %s): workflow steps start a loop",
				ErrConflict, ref.Run, p.run.Workflow, child.Workflow, strings.Join(chain, " -> "), child.Workflow)
		}
		if root.run.Parent == nil || depth > MaxDepth {
			break
		}
		up, err := tx.load(root.run.Parent.Run)
		if err != nil {
			return err
		}
		if up == nil {
			break // retired before its descendant: the tree is counted from here
		}
		root = up
		path = append(path, root.run.Workflow)
	}
	if maxTree > 0 && root.run.TreeSize+2 > maxTree && !tx.s.hooks.NoTreeLimit {
		return fmt.Errorf("%w: run %s's tree would hold %d runs with %s, more than the limit of %d (the run and all its descendants; flowd --max-run-tree)",
			ErrConflict, root.run.ID, root.run.TreeSize+2, child.ID, maxTree)
	}
	root.runDirty = true
	root.run.TreeSize++
	p.runDirty = true
	p.run.Children = append(p.run.Children, child.ID)
	child.Parent, child.Depth = ref, p.run.Depth+1
	return nil
}

// childEnded tells a child's parent that it ended: a parent parked on it counts it, and
// wakes once every child it waits for has ended.
func (tx *applyBatch) childEnded(c *cachedRun, idx int, e *Entry) error {
	p, err := tx.load(c.run.Parent.Run)
	if err != nil || p == nil {
		return err
	}
	w := p.run.Waiting
	if p.run.Status != StatusWaiting || w.Kind != WaitChild || !slices.Contains(w.Children, c.run.ID) || slices.Contains(w.Ended, c.run.ID) {
		return nil
	}
	p.runDirty = true
	w.Ended = append(w.Ended, c.run.ID)
	detail := fmt.Sprintf("child %s %s", c.run.ID, c.run.Status)
	if p.run.ready(tx.s.hooks.NoInputsByExclude) {
		p.wakeRun()
		detail += "; the run wakes"
	}
	tx.event(p, idx, e, "accepted", detail)
	return nil
}

// cancelChildren cancels a cancelled run's children that have not ended, and theirs.
func (tx *applyBatch) cancelChildren(c *cachedRun, idx int, e *Entry) error {
	for _, id := range c.run.Children {
		child, err := tx.load(id)
		if err != nil {
			return err
		}
		if child == nil || child.run.Status.Terminal() {
			continue
		}
		ce := *e
		ce.Run, ce.Reason = id, fmt.Sprintf("its parent %s was cancelled", c.run.ID)
		if err := tx.finishEarly(child, &ce, StatusCancelled); err != nil {
			return err
		}
		tx.event(child, idx, &ce, "accepted", ce.Reason)
		if err := tx.cancelChildren(child, idx, &ce); err != nil {
			return err
		}
	}
	return nil
}

// ChildID is the run ID of the child that step (foreach item, or ItemWhole) of run
// parent starts: the same for every epoch, owner and retry of the parent, so a child is
// started once however often its start is written. Within the ID rule's 128 characters
// it is readable (parent.step or parent.step.item); beyond, the parent's ID is cut and a
// digest of the whole keeps it unique.
func ChildID(parent, step string, item int) string {
	id := parent + "." + step
	if item != ItemWhole {
		id += "." + strconv.Itoa(item)
	}
	if len(id) <= 128 {
		return id
	}
	sum := sha256.Sum256([]byte(id))
	tail := "." + step + "-" + hex.EncodeToString(sum[:8])
	if item != ItemWhole {
		tail += "." + strconv.Itoa(item)
	}
	if len(tail) > 100 {
		tail = "." + hex.EncodeToString(sum[:12])
	}
	return strings.TrimRight(parent[:min(len(parent), 128-len(tail))], ".") + tail
}

// ChildOf says whether r is the child that ref (a parent run's step and foreach item)
// started: its submit named that parent, step and item. A parent never takes a run that
// is not for its child: one started by a person under the child's ID, or a child of
// another step. any is the binding's negative control (every run is taken).
func ChildOf(r *Run, ref ParentRef, any bool) error {
	if any || r.Parent != nil && *r.Parent == ref {
		return nil
	}
	by := "started by " + r.StartedBy
	if r.StartedBy == "" {
		by = "trigger " + r.Trigger
	}
	if r.Parent != nil {
		by = fmt.Sprintf("the child of run %s step %s item %d", r.Parent.Run, r.Parent.Step, r.Parent.Item)
	}
	return fmt.Errorf("%w: run %s exists under the ID of run %s's child (step %s), but this step did not start it (it is a run of workflow %s, %s): a parent never adopts a run it did not start; cancel or retire that run, then retry the parent",
		ErrConflict, r.ID, ref.Run, ref.Step, r.Workflow, by)
}
