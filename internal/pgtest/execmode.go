package pgtest

import "github.com/jackc/pgx/v5"

// QueryExecModes are the query exec modes pgx offers
// (default_query_exec_mode in a URL), the default first, for tests that run
// the store in each.
var QueryExecModes = []pgx.QueryExecMode{
	pgx.QueryExecModeCacheStatement,
	pgx.QueryExecModeCacheDescribe,
	pgx.QueryExecModeDescribeExec,
	pgx.QueryExecModeExec,
	pgx.QueryExecModeSimpleProtocol,
}
