# Conveniences; the scripts are the source of truth.
.PHONY: test demo fuzz bench

test: ## gofmt check, tidy go.mod files, go vet and go test -race over every module in go.work
	bash scripts/test

demo: ## the rides demo against a throwaway Postgres
	go run ./examples/rides demo

fuzz: ## run every fuzzer for FUZZTIME (default 60s)
	bash scripts/fuzz

bench: ## the benchmark suite: prints a markdown report, writes it and a plot into idembench-report/ (~6 min)
	go run ./cmd/idembench
