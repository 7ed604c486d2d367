// Package specs decodes the workflow versions the state holds, once each: versions
// never change, so a decoded one is kept for the node's life. The engine's API, the
// leader's decisions and the workers read workflows through it.
package specs

import (
	"fmt"
	"strconv"
	"sync"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/workflow"
)

// Source is where the versions come from (a *checkpoint.Store).
type Source interface {
	Workflow(name string, version int) (*checkpoint.WorkflowVersion, error)
}

// Cache holds the decoded versions. Safe for concurrent use.
type Cache struct {
	src Source
	m   sync.Map // "name@version" -> *workflow.Workflow
}

// New returns a cache over src.
func New(src Source) *Cache { return &Cache{src: src} }

// Workflow returns a workflow version (0: the latest).
func (c *Cache) Workflow(name string, version int) (*workflow.Workflow, error) {
	if version > 0 {
		if w, ok := c.m.Load(name + "@" + strconv.Itoa(version)); ok {
			return w.(*workflow.Workflow), nil
		}
	}
	v, err := c.src.Workflow(name, version)
	if err != nil {
		return nil, err
	}
	if w, ok := c.m.Load(name + "@" + strconv.Itoa(v.Version)); ok {
		return w.(*workflow.Workflow), nil
	}
	w, err := workflow.Decode(v.Spec)
	if err != nil {
		return nil, err
	}
	w.Version = v.Version
	c.m.Store(name+"@"+strconv.Itoa(v.Version), w)
	return w, nil
}

// OfRun is the workflow version a run started with: from the run itself when it
// carries its definition, else from the versions in the state.
func (c *Cache) OfRun(r *checkpoint.Run) (*workflow.Workflow, error) {
	if len(r.Spec) > 0 {
		w, err := workflow.Decode(r.Spec)
		if err != nil {
			return nil, fmt.Errorf("run %s: its workflow spec: %w", r.ID, err)
		}
		return w, nil
	}
	w, err := c.Workflow(r.Workflow, r.Version)
	if err != nil {
		return nil, fmt.Errorf("run %s: workflow %s version %d: %w", r.ID, r.Workflow, r.Version, err)
	}
	if r.Handler != nil { // a handler run runs its event's steps (checkpoint/operations.go)
		hw := w.HandlerWorkflow(r.Handler.Event)
		if hw == nil {
			return nil, fmt.Errorf("run %s: workflow %s version %d has no %s steps", r.ID, r.Workflow, r.Version, r.Handler.Event)
		}
		return hw, nil
	}
	return w, nil
}
