package idemgrpc

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/emptypb"
)

// Method is a unary method served by a flow, for [UnaryServerInterceptor].
// Only a [*Handler] implements it.
type Method interface {
	// FullMethod is the method served, "/package.Service/Method".
	FullMethod() string

	serve(ctx context.Context, req any) (any, error)
	flowKey() string
}

var _ Method = (*Handler[*emptypb.Empty, *emptypb.Empty, Input[*emptypb.Empty]])(nil)

// UnaryServerInterceptor returns an interceptor that runs each method's flow
// in place of the service's own implementation of the method, and passes
// every other method to the service untouched. The service's implementation
// of a configured method is never called: it may be left to the generated
// Unimplemented<Service>Server.
//
// Put it last in the chain, after the interceptors that authenticate the
// caller, so that Config.Scope finds the caller in the context:
//
//	grpc.NewServer(grpc.ChainUnaryInterceptor(auth, idem))
//
// Each method is served by one flow, and each flow serves one method: the
// same flow on two methods would let a key sent to one replay the other's
// answer. Configuring a method twice, or a flow twice, is an error.
func UnaryServerInterceptor(methods ...Method) (grpc.UnaryServerInterceptor, error) {
	byMethod := map[string]Method{}
	byFlow := map[string]string{}
	var errs []error
	for i, m := range methods {
		if m == nil {
			errs = append(errs, fmt.Errorf("method %d is nil", i))
			continue
		}
		name := m.FullMethod()
		if _, dup := byMethod[name]; dup {
			errs = append(errs, fmt.Errorf("%s is configured twice", name))
			continue
		}
		if other, dup := byFlow[m.flowKey()]; dup {
			errs = append(errs, fmt.Errorf("flow %q serves both %s and %s; give each method a flow of its own", m.flowKey(), other, name))
			continue
		}
		byMethod[name], byFlow[m.flowKey()] = m, name
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("idemgrpc: UnaryServerInterceptor: %w", errors.Join(errs...))
	}
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		m, ok := byMethod[info.FullMethod]
		if !ok {
			return handler(ctx, req)
		}
		return m.serve(ctx, req)
	}, nil
}
