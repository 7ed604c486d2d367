package engine

// Ops are an operator's verbs beside the library API of runs and workflows: a
// schedule's pause, resume, next fire times and backfill; the cluster's members, its
// version and its streams' repair; the log's dump and snapshot; the zombie drill. The
// wire API (API, flowctl's commands) answers with them; a program embedding the
// engine reaches them as e.Ops().
type Ops struct{ e *Engine }

// Ops are e's operator verbs.
func (e *Engine) Ops() Ops { return Ops{e: e} }
