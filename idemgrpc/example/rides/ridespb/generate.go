// Package ridespb is the rides example's gRPC API.
//
// The generated files are committed. To regenerate them, install protoc
// (Debian: apt-get install protobuf-compiler; 3.21.12 made these) and the two
// plugins at the versions recorded in the files' headers:
//
//	go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
//	go install google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.2
//
// and run go generate in this directory.
package ridespb

//go:generate protoc --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative rides.proto
