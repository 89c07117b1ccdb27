// Package idemgrpc serves idem flows as gRPC unary methods.
package idemgrpc
