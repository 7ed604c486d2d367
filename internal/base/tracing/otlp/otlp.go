// Package otlp installs flow's trace exporter from the standard OTEL_* environment
// variables (flowd's; internal/base/tracing has the rest). Kept apart so that what only
// calls the tracing API (flowctl) links no SDK.
package otlp

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.37.0"

	"github.com/flowrun/flow/internal/base/tracing"
)

// Setup installs a tracer provider exporting OTLP over HTTP when the environment asks
// for traces: OTEL_TRACES_EXPORTER=otlp, or an OTLP endpoint
// (OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) with the exporter
// unset. OTEL_SDK_DISABLED=true or OTEL_TRACES_EXPORTER=none turn it off. The exporter
// and the SDK read the rest of the standard variables themselves (headers, timeout,
// OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES, OTEL_TRACES_SAMPLER and its argument,
// the batch processor's OTEL_BSP_*). getenv nil reads the process's. The returned
// shutdown flushes what is buffered; nil when nothing was installed. An environment
// that asks for what flow does not do (another exporter, OTLP over gRPC) is an error
// naming the variable.
func Setup(ctx context.Context, service string, getenv func(string) string, log *slog.Logger) (shutdown func(context.Context) error, err error) {
	if getenv == nil {
		getenv = os.Getenv
	}
	if strings.EqualFold(getenv("OTEL_SDK_DISABLED"), "true") {
		return nil, nil
	}
	switch exp := strings.TrimSpace(getenv("OTEL_TRACES_EXPORTER")); exp {
	case "none":
		return nil, nil
	case "":
		if getenv("OTEL_EXPORTER_OTLP_ENDPOINT") == "" && getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") == "" {
			return nil, nil // nothing asked for: no exporter, no cost
		}
	case "otlp":
	default:
		return nil, fmt.Errorf("tracing: OTEL_TRACES_EXPORTER=%q: flow exports traces with otlp (or none)", exp)
	}
	for _, v := range []string{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"} {
		if p := getenv(v); p != "" {
			if p != "http/protobuf" {
				return nil, fmt.Errorf("tracing: %s=%q: flow exports OTLP over HTTP (http/protobuf, port 4318)", v, p)
			}
			break
		}
	}
	exporter, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, fmt.Errorf("tracing: the OTLP exporter: %w", err)
	}
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(semconv.ServiceName(orDefault(getenv("OTEL_SERVICE_NAME"), service))))
	if err != nil {
		res = resource.Default()
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exporter), sdktrace.WithResource(res))
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.TraceContext{})
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) { log.Warn("tracing: export", "err", err) }))
	tracing.SetEnabled()
	log.Info("traces are exported over OTLP/HTTP", "service", orDefault(getenv("OTEL_SERVICE_NAME"), service))
	return tp.Shutdown, nil
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
