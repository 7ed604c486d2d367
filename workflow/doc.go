// Package workflow reads workflow YAML (../shared/CONTRACT.md) strictly, with errors
// that name file:line:column and a hint, and renders its templates.
//
// Templates are `{{ expr }}` where expr is a dotted path into the scope (inputs.date,
// steps.collect.output.drivers, item.id, run.id, run.epoch), a helper (yesterday, now),
// or `not expr` / `expr == literal` / `expr != literal` for conditions. A string that
// is exactly one template keeps the value's type (a list stays a list); anything else
// is string interpolation. A missing key is an error, never an empty string.
package workflow
