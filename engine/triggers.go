package engine

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/internal/base/audit"
	"github.com/flowrun/flow/internal/base/jsport"
	"github.com/flowrun/flow/internal/base/port"
	"github.com/flowrun/flow/internal/base/supervise"
	"github.com/flowrun/flow/workflow"
)

// Runs started by messages (a workflow's `on:`; docs/workflow-spec.md, "Runs started
// by messages"). While this node leads, and once the cluster version is 3 (a run's
// trigger "event" is a format-3 entry), the triggers part keeps FLOW_EVENTS capturing
// every trigger's subject that names no stream of its own, keeps one durable pull
// consumer per trigger, and turns each message into a run start (or a signal-with-start)
// whose run ID is rendered from the message. A message is acknowledged only once its
// run is in the log; one that cannot make a run is terminated and counted.
//
// Exactly once per message ID, across failover, holds because the run ID is the
// de-duplication key and the log judges it: a message delivered again (its leader
// died before the ack, a deposed leader still fetching, a publisher that sent it twice)
// renders the same ID, and the second submit is refused (checkpoint.ErrRunExists) and
// acknowledged as seen. The consumers are JetStream's: their place survives the leader.

// TriggerPoll is how often the triggers part looks for messages when it found none.
const TriggerPoll = 200 * time.Millisecond

// triggerRefresh is how often it reads the workflows' triggers again.
const triggerRefresh = time.Second

// triggerFetch is how many messages one fetch of a trigger's consumer takes.
const triggerFetch = 64

// TriggerAckWait is how long a message taken and not acknowledged stays with its taker
// before JetStream gives it to the next fetch (a leader that died with it).
const TriggerAckWait = 30 * time.Second

// Outcomes of a trigger's message (flow_trigger_messages_total's outcome).
const (
	TriggerStarted   = "started"   // a run was started
	TriggerSignalled = "signalled" // an existing run was signalled
	TriggerSeen      = "seen"      // its run ID was taken: nothing started
	TriggerRefused   = "refused"   // it cannot make a run (a template, an ID, inputs): terminated
	TriggerRetried   = "retried"   // the start failed for now (NATS, the log): given back
)

// triggerIDPerDelivery is the control of the trigger's de-duplication in real processes
// (-ldflags "-X github.com/flowrun/flow/engine.triggerIDPerDelivery=1"; empty in every
// release): a run ID also names the message's stream sequence, so a message delivered
// twice starts two runs (clustertest's TestTriggerStartsOneRunPerMessageAcrossFailover).
var triggerIDPerDelivery string

// consumerPrefix starts the names of flow's trigger consumers.
const consumerPrefix = "on_"

// trigger is one trigger of the latest version of a workflow, with its consumer's name.
type trigger struct {
	workflow string
	at       time.Time // when the workflow version was applied: its consumer starts there
	t        workflow.Trigger
	stream   string
	durable  string
}

// triggerDurable names a trigger's consumer: the workflow and a digest of its stream and
// subject, so that a changed subject gets a consumer of its own.
func triggerDurable(wf, stream, subject string) string {
	sum := sha256.Sum256([]byte(stream + "\x00" + subject))
	return consumerPrefix + wf + "_" + hex.EncodeToString(sum[:6])
}

// triggerService is the triggers part's state (one goroutine: the part's Run).
type triggerService struct {
	e   *Engine
	log *slog.Logger

	consumers map[string]jetstream.Consumer // by durable name, while leading
	subjects  []string                      // FLOW_EVENTS' subjects as last set or read
	lastPlan  time.Time
	plan      []trigger

	mu       sync.Mutex
	counts   map[[2]string]int64 // (workflow, outcome) -> messages
	problem  string              // why triggers do not run as applied ("" when they do)
	lastWarn string
}

func newTriggerService(e *Engine) *triggerService {
	return &triggerService{e: e, log: e.log.With("part", "triggers"), counts: map[[2]string]int64{}}
}

// triggersPart is the supervised part: it reaches NATS, so it is restarted when silent.
func (ts *triggerService) part() supervise.Part {
	return supervise.Part{Name: "triggers", Silence: ts.e.silence(), Run: ts.run}
}

func (ts *triggerService) run(ctx context.Context, alive func()) error {
	ts.consumers, ts.subjects, ts.lastPlan = map[string]jetstream.Consumer{}, nil, time.Time{}
	tick := time.NewTicker(TriggerPoll)
	defer tick.Stop()
	for {
		alive()
		busy := false
		switch {
		case ts.e.leading() == nil:
			ts.consumers = map[string]jetstream.Consumer{} // the next term looks them up again
		case ts.e.store.ClusterVersion() < checkpoint.LogFormatFlowControl:
			if time.Since(ts.lastPlan) >= triggerRefresh {
				ts.lastPlan, ts.plan = time.Now(), ts.readPlan()
			}
			if len(ts.plan) > 0 {
				ts.setProblem(fmt.Sprintf("runs started by messages wait for cluster version %d (it is %d): every node must run a release that reads log format %d (flowctl cluster status)",
					checkpoint.LogFormatFlowControl, ts.e.store.ClusterVersion(), checkpoint.LogFormatFlowControl))
			}
		default:
			if time.Since(ts.lastPlan) >= triggerRefresh {
				ts.refresh(ctx)
			}
			busy = ts.consume(ctx)
		}
		if busy {
			if ctx.Err() != nil {
				return nil
			}
			continue
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// readPlan is every trigger of the latest version of every workflow, in a stable order.
func (ts *triggerService) readPlan() []trigger {
	versions, err := ts.e.store.Workflows()
	if err != nil {
		return ts.plan
	}
	var out []trigger
	for _, v := range versions {
		w, err := ts.e.specs.Workflow(v.Name, v.Version)
		if err != nil || len(w.On) == 0 {
			continue
		}
		for _, t := range w.On {
			stream := t.Stream
			if stream == "" {
				stream = port.EventsStream
			}
			out = append(out, trigger{workflow: w.Name, at: v.At, t: t, stream: stream, durable: triggerDurable(w.Name, stream, t.Subject)})
		}
	}
	return out
}

// refresh reads the triggers again and makes JetStream match them: FLOW_EVENTS'
// subjects, a consumer per trigger, none for a trigger that is gone.
func (ts *triggerService) refresh(ctx context.Context) {
	ts.lastPlan = time.Now()
	ts.plan = ts.readPlan()
	var problems []string
	if err := ts.ensureEvents(ctx); err != nil {
		problems = append(problems, err.Error())
	}
	want := map[string]bool{}
	for _, tr := range ts.plan {
		want[tr.durable] = true
		if ts.consumers[tr.durable] != nil {
			continue
		}
		c, err := ts.consumer(ctx, tr)
		if err != nil {
			problems = append(problems, fmt.Sprintf("workflow %s, trigger on %s (stream %s): %v", tr.workflow, tr.t.Subject, tr.stream, err))
			continue
		}
		ts.consumers[tr.durable] = c
	}
	for name := range ts.consumers {
		if !want[name] {
			delete(ts.consumers, name)
		}
	}
	ts.dropStale(ctx, want)
	ts.setProblem(strings.Join(problems, "; "))
}

// ensureEvents makes FLOW_EVENTS capture the subjects of the triggers that name no
// stream: created by this node if missing (a node's credential may), updated through
// the admin path (it may not update a stream).
func (ts *triggerService) ensureEvents(ctx context.Context) error {
	var subjects []string
	for _, tr := range ts.plan {
		if tr.t.Stream == "" && !slices.Contains(subjects, tr.t.Subject) {
			subjects = append(subjects, tr.t.Subject)
		}
	}
	slices.Sort(subjects)
	if len(subjects) == 0 || slices.Equal(subjects, ts.subjects) {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	e := ts.e
	s, err := e.js.Stream(ctx, port.EventsStream)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		js := e.js
		if e.adminJS != nil {
			js = e.adminJS
		}
		if _, err := js.CreateStream(ctx, jsport.EventsConfig(e.replicas, subjects)); err != nil {
			return fmt.Errorf("create %s for subjects %s: %w%s", port.EventsStream, strings.Join(subjects, ", "), err, overlapHint(err))
		}
		ts.log.Info("created the stream of the workflows' triggers", "stream", port.EventsStream, "subjects", subjects)
	case err != nil:
		return fmt.Errorf("read %s: %w", port.EventsStream, err)
	default:
		have := slices.Sorted(slices.Values(s.CachedInfo().Config.Subjects))
		if slices.Equal(have, subjects) {
			break
		}
		if e.adminJS == nil {
			return fmt.Errorf("%s captures %s, the triggers need %s, and this node's credential may not update a stream: run the leader with an admin path (docs/security.md, \"Sealing and repair\"), or name a stream of your own in the trigger (stream:)",
				port.EventsStream, strings.Join(have, ", "), strings.Join(subjects, ", "))
		}
		cfg := s.CachedInfo().Config
		cfg.Subjects = subjects
		if _, err := e.adminJS.UpdateStream(ctx, cfg); err != nil {
			return fmt.Errorf("set %s's subjects to %s: %w%s", port.EventsStream, strings.Join(subjects, ", "), err, overlapHint(err))
		}
		ts.log.Info("the stream of the workflows' triggers captures new subjects", "stream", port.EventsStream, "subjects", subjects, "before", have)
	}
	ts.subjects = subjects
	return nil
}

// overlapHint explains JetStream's refusal of a subject another stream captures.
func overlapHint(err error) string {
	if strings.Contains(err.Error(), "overlap") {
		return " (another stream captures these subjects already: name it in the trigger, stream: NAME)"
	}
	return ""
}

// consumer looks up a trigger's durable consumer, making it if missing: it delivers
// the messages stored from the workflow version's apply on, each to one fetch at a
// time, acknowledged one by one.
func (ts *triggerService) consumer(ctx context.Context, tr trigger) (jetstream.Consumer, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	s, err := ts.e.js.Stream(ctx, tr.stream)
	if err != nil {
		return nil, err
	}
	c, err := s.Consumer(ctx, tr.durable)
	if err == nil || !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return c, err
	}
	start := tr.at
	return s.CreateConsumer(ctx, jetstream.ConsumerConfig{
		Durable:       tr.durable,
		Description:   "flow: the messages that start runs of workflow " + tr.workflow,
		FilterSubject: tr.t.Subject,
		DeliverPolicy: jetstream.DeliverByStartTimePolicy,
		OptStartTime:  &start,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       TriggerAckWait,
		MaxAckPending: 1000,
	})
}

// dropStale deletes flow's trigger consumers on FLOW_EVENTS that no trigger has now (a
// workflow's subject changed, or its trigger was removed). Consumers on an operator's
// stream are left: flow cannot tell which of its streams it once read.
func (ts *triggerService) dropStale(ctx context.Context, want map[string]bool) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	s, err := ts.e.js.Stream(ctx, port.EventsStream)
	if err != nil {
		return
	}
	names := s.ConsumerNames(ctx)
	for name := range names.Name() {
		if strings.HasPrefix(name, consumerPrefix) && !want[name] {
			if err := s.DeleteConsumer(ctx, name); err == nil {
				ts.log.Info("removed the consumer of a trigger no workflow has now", "consumer", name)
			}
		}
	}
}

// consume takes what each trigger's consumer has and handles it; busy: some did.
func (ts *triggerService) consume(ctx context.Context) (busy bool) {
	for _, tr := range ts.plan {
		c := ts.consumers[tr.durable]
		if c == nil || ctx.Err() != nil {
			continue
		}
		batch, err := c.FetchNoWait(triggerFetch)
		if err != nil {
			delete(ts.consumers, tr.durable) // looked up again at the next refresh
			continue
		}
		for m := range batch.Messages() {
			busy = true
			ts.handle(ctx, tr, m)
		}
		if err := batch.Error(); err != nil && !errors.Is(err, context.Canceled) {
			delete(ts.consumers, tr.durable)
		}
	}
	return busy
}

// handle turns one message into a run start (or a signal-with-start) and settles it.
func (ts *triggerService) handle(ctx context.Context, tr trigger, m jetstream.Msg) {
	outcome, err := ts.start(ctx, tr, m)
	switch outcome {
	case TriggerRefused:
		_ = m.Term()
		ts.warn(fmt.Sprintf("workflow %s: a message on %s started no run: %v", tr.workflow, m.Subject(), err))
	case TriggerRetried:
		_ = m.NakWithDelay(time.Second)
		ts.warn(fmt.Sprintf("workflow %s: a message on %s: the start failed, it is tried again: %v", tr.workflow, m.Subject(), err))
	default:
		_ = m.Ack()
	}
	ts.mu.Lock()
	ts.counts[[2]string{tr.workflow, outcome}]++
	ts.mu.Unlock()
}

// start is what one message makes: an outcome, and the error behind a refusal or retry.
func (ts *triggerService) start(ctx context.Context, tr trigger, m jetstream.Msg) (string, error) {
	return ts.e.startFromMessage(ctx, tr.workflow, tr.t, TriggerMessageOf(m))
}

// startFromMessage is what trigger t of workflow wf makes of message msg: a run start
// (or a signal-with-start) whose run ID msg renders. Below cluster version 3 nothing is
// written and the message is to be tried again (TriggerRetried).
func (e *Engine) startFromMessage(ctx context.Context, wf string, t workflow.Trigger, msg workflow.TriggerMessage) (string, error) {
	if v := e.store.ClusterVersion(); v < checkpoint.LogFormatFlowControl {
		return TriggerRetried, fmt.Errorf("the cluster version is %d; runs started by messages need %d", v, checkpoint.LogFormatFlowControl)
	}
	id, inputs, err := t.Render(wf, msg)
	if err != nil {
		return TriggerRefused, err
	}
	if e.hooks.TriggerIDPerDelivery.Load() || triggerIDPerDelivery != "" { // the control: every delivery a run of its own
		id = fmt.Sprintf("%s-%d", id, msg.Seq)
	}
	ctx, cancel := context.WithTimeout(audit.WithActor(ctx, "trigger:"+wf), 30*time.Second)
	defer cancel()
	started := true
	if t.Signal != "" {
		started, err = e.SignalWithStart(ctx, id, t.Signal, wf, inputs,
			SignalOptions{Data: msg.DataJSON(), ID: triggerSignalID(msg), Trigger: checkpoint.TriggerEvent})
	} else {
		_, err = e.StartRun(ctx, wf, inputs, RunOptions{ID: id, Trigger: checkpoint.TriggerEvent})
	}
	switch {
	case err == nil && started:
		return TriggerStarted, nil
	case err == nil:
		return TriggerSignalled, nil
	case errors.Is(err, checkpoint.ErrRunExists):
		return TriggerSeen, nil
	case errors.Is(err, ErrBadInput), errors.Is(err, checkpoint.ErrInvalidEntry), errors.Is(err, checkpoint.ErrConflict):
		return TriggerRefused, err
	}
	return TriggerRetried, err
}

// DeliverTriggerMessage is what the triggers part does with a message it fetched for
// trigger index of workflow wf's latest version, without JetStream: the simulation
// delivers its messages through it. The outcome is one of the Trigger* constants.
func (a *API) DeliverTriggerMessage(ctx context.Context, wf string, index int, msg workflow.TriggerMessage) (string, error) {
	w, err := a.e.Workflow(wf, 0)
	if err != nil {
		return TriggerRetried, err
	}
	if index < 0 || index >= len(w.On) {
		return TriggerRefused, fmt.Errorf("%w: workflow %s has no trigger %d", ErrBadInput, wf, index)
	}
	return a.e.startFromMessage(ctx, wf, w.On[index], msg)
}

// triggerSignalID is the de-duplication key of a trigger's signal: the message's ID,
// digested so that any ID a publisher chose is a valid key.
func triggerSignalID(m workflow.TriggerMessage) string {
	sum := sha256.Sum256([]byte(m.ID))
	return "msg-" + hex.EncodeToString(sum[:12])
}

// TriggerMessageOf is what a trigger's templates read of a JetStream message: its ID is
// the Nats-Msg-Id header, or the stream and sequence when it has none.
func TriggerMessageOf(m jetstream.Msg) workflow.TriggerMessage {
	tm := workflow.TriggerMessage{Subject: m.Subject(), Data: m.Data(), Header: map[string][]string(m.Headers())}
	if meta, err := m.Metadata(); err == nil {
		tm.Stream, tm.Seq = meta.Stream, meta.Sequence.Stream
	}
	tm.ID = m.Headers().Get("Nats-Msg-Id")
	if tm.ID == "" {
		tm.ID = fmt.Sprintf("%s-%d", tm.Stream, tm.Seq)
	}
	return tm
}

// warn logs a trigger's problem once until it changes.
func (ts *triggerService) warn(s string) {
	ts.mu.Lock()
	same := s == ts.lastWarn
	ts.lastWarn = s
	ts.mu.Unlock()
	if !same {
		ts.log.Warn(s)
	}
}

func (ts *triggerService) setProblem(p string) {
	ts.mu.Lock()
	changed := p != ts.problem
	ts.problem = p
	ts.mu.Unlock()
	if changed && p != "" {
		ts.log.Error("triggers", "problem", p)
	}
}

// TriggerStats are the triggers' counts by workflow and outcome, and their problem.
type TriggerStats struct {
	Messages map[[2]string]int64
	Problem  string
}

// Triggers reads the triggers part's counts (this node's, while it led).
func (e *Engine) Triggers() TriggerStats {
	if e.triggers == nil {
		return TriggerStats{}
	}
	ts := e.triggers
	ts.mu.Lock()
	defer ts.mu.Unlock()
	return TriggerStats{Messages: maps.Clone(ts.counts), Problem: ts.problem}
}
