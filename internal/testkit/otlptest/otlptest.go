// Package otlptest is an OTLP/HTTP trace receiver for tests: a real HTTP server that
// takes what OpenTelemetry exporters send (POST /v1/traces, protobuf, gzip or not),
// decodes it with the protocol's own types (go.opentelemetry.io/proto/otlp) and keeps
// the spans, so that a test reads what flowd really exported, over the wire, rather
// than what a mock exporter was handed in process. For tests only.
package otlptest

import (
	"compress/gzip"
	"encoding/hex"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	"google.golang.org/protobuf/proto"
)

// Span is one received span, flattened.
type Span struct {
	Service  string
	TraceID  string
	SpanID   string
	ParentID string
	Name     string
	Attrs    map[string]string
	Events   []string
	Error    string // the span's status message when its status is error
}

// Receiver keeps the spans it received.
type Receiver struct {
	srv *http.Server
	url string

	mu    sync.Mutex
	spans []Span
}

// Start serves on a free loopback port until the test ends.
func Start(t testing.TB) *Receiver {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &Receiver{url: "http://" + ln.Addr().String()}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/traces", r.traces)
	r.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = r.srv.Serve(ln) }()
	t.Cleanup(func() { _ = r.srv.Close() })
	return r
}

// URL is the receiver's base URL, for OTEL_EXPORTER_OTLP_ENDPOINT.
func (r *Receiver) URL() string { return r.url }

func (r *Receiver) traces(w http.ResponseWriter, req *http.Request) {
	var body io.Reader = http.MaxBytesReader(w, req.Body, 32<<20)
	if req.Header.Get("Content-Encoding") == "gzip" {
		gz, err := gzip.NewReader(body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		body = gz
	}
	raw, err := io.ReadAll(body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var msg coltracepb.ExportTraceServiceRequest
	if err := proto.Unmarshal(raw, &msg); err != nil {
		http.Error(w, "not an OTLP ExportTraceServiceRequest: "+err.Error(), http.StatusBadRequest)
		return
	}
	var got []Span
	for _, rs := range msg.GetResourceSpans() {
		service := attrs(rs.GetResource().GetAttributes())["service.name"]
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				sp := Span{Service: service, TraceID: hex.EncodeToString(s.GetTraceId()), SpanID: hex.EncodeToString(s.GetSpanId()),
					ParentID: hex.EncodeToString(s.GetParentSpanId()), Name: s.GetName(), Attrs: attrs(s.GetAttributes())}
				for _, ev := range s.GetEvents() {
					sp.Events = append(sp.Events, ev.GetName())
				}
				if s.GetStatus().GetCode() == 2 { // STATUS_CODE_ERROR
					sp.Error = s.GetStatus().GetMessage()
				}
				got = append(got, sp)
			}
		}
	}
	r.mu.Lock()
	r.spans = append(r.spans, got...)
	r.mu.Unlock()
	resp, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(resp)
}

func attrs(kvs []*commonpb.KeyValue) map[string]string {
	out := map[string]string{}
	for _, kv := range kvs {
		v := kv.GetValue()
		switch {
		case v.GetStringValue() != "":
			out[kv.GetKey()] = v.GetStringValue()
		default:
			if _, ok := v.GetValue().(*commonpb.AnyValue_IntValue); ok {
				out[kv.GetKey()] = strconv.FormatInt(v.GetIntValue(), 10)
			} else if _, ok := v.GetValue().(*commonpb.AnyValue_BoolValue); ok {
				out[kv.GetKey()] = map[bool]string{true: "true", false: "false"}[v.GetBoolValue()]
			}
		}
	}
	return out
}

// Spans are the spans received so far, of trace traceID ("": all).
func (r *Receiver) Spans(traceID string) []Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []Span
	for _, s := range r.spans {
		if traceID == "" || s.TraceID == traceID {
			out = append(out, s)
		}
	}
	return out
}
