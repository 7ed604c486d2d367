// Package ident says what may name a run, an owner, a node, a workflow or a step. The
// state machine, the engine, the workflow parser and the API all judge names by these
// rules; they live in a leaf package so that the workflow parser and the client need not
// link the state machine to know them.
package ident
