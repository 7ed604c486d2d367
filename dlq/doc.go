// Package dlq is the dead-letter queue's stream: a run whose epoch changed more than
// max_epochs times is dead-lettered by the log's apply itself (deterministically, on
// every node); this package publishes a message for it on the FLOW_DLQ stream
// (subject flow.dlq.<run>, deduplicated by run and epoch) so that alerting can
// subscribe. Listing, showing, retrying and purging read and write the log (engine,
// flowctl dlq).
package dlq
