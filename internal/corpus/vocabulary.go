package corpus

// The words objects are made of: what a cluster's labels, annotations,
// managers and messages hold, so that a compressor finds in them what it
// would find in a real cluster's objects, no more.

var (
	regions       = []string{"eu-west-1", "eu-central-1", "us-east-1", "us-east-2", "us-west-2", "ap-southeast-1", "ap-northeast-1"}
	zoneLetters   = []string{"a", "b", "c"}
	instanceTypes = []string{"m5.large", "m5.xlarge", "m5.2xlarge", "c6i.xlarge", "c6i.4xlarge", "r6g.2xlarge", "t3.medium", "n2-standard-8", "e2-standard-4", "Standard_D4s_v5"}
	pools         = []string{"default", "general", "batch", "gpu", "spot", "system", "highmem", "ingest"}
	clusters      = []string{"prod-eu", "prod-us", "staging", "dev", "analytics", "edge-01", "payments-prod"}
	teams         = []string{"payments", "checkout", "search", "platform", "data", "identity", "observability", "growth", "risk", "mobile-backend"}
	envs          = []string{"production", "staging", "development", "canary"}
	tiers         = []string{"frontend", "backend", "batch", "cache", "database", "worker"}
	namespaces    = []string{"default", "payments", "checkout", "search", "platform-system", "data-pipelines", "identity", "monitoring", "kube-fleet", "ml-training", "growth-experiments", "risk-scoring"}
	apps          = []string{"order-processor", "invoice-renderer", "search-indexer", "session-gc", "fraud-scorer", "thumbnailer", "report-builder", "ledger-sync", "email-dispatcher", "feature-extractor", "cache-warmer", "audit-exporter", "billing-reconciler", "geo-enricher", "log-compactor"}
	components    = []string{"worker", "scheduler", "exporter", "migrator", "compactor", "reconciler", "ingester"}
	partOf        = []string{"checkout-platform", "search-platform", "billing", "data-platform", "identity-platform", "observability-stack"}
	managedBy     = []string{"Helm", "argocd", "kustomize", "fleet-operator", "terraform"}
	queues        = []string{"orders", "invoices", "emails", "thumbnails", "events", "audit", "reindex", "payouts", "webhooks"}
	databases     = []string{"orders", "ledger", "catalog", "users", "events", "sessions"}
	owners        = []string{"alice.nguyen", "bob.kowalski", "carmen.diaz", "deepak.rao", "erin.obrien", "farid.haddad", "grace.liu", "hiro.tanaka", "ines.moreau", "jon.berg"}
	versions      = []string{"v1.14.3", "v1.14.4", "v1.15.0", "v1.15.1", "v1.16.0-rc.2", "v2.0.1", "v2.1.0"}
	logLevels     = []string{"info", "info", "info", "debug", "warn"}
	cpus          = []string{"100m", "250m", "500m", "1", "2", "4"}
	memories      = []string{"128Mi", "256Mi", "512Mi", "1Gi", "2Gi", "4Gi", "8Gi"}
	hostsAndPaths = []string{"s3://fleet-artifacts/%s/%d/part-%d.parquet", "gs://fleet-exports/%s/%d/shard-%d.avro", "https://api.internal.example.com/v2/%s/%d/items?page=%d", "kafka://events-%s/partition-%d/offset-%d", "postgres://%s.db.svc:5432/replica-%d?batch=%d"}

	descriptions = []string{
		"Runs the %s jobs for the %s team; pages on-call after %d failures",
		"Batch worker for %s, migrated from the legacy cron host in Q%d",
		"Handles %s traffic for %s; see the runbook before draining",
		"Owned by %s; scale with care, the downstream quota is %d requests a second",
	}
	changeCauses = []string{
		"kubectl apply --filename=deploy/%s/%s.yaml --record=true",
		"helm upgrade %s charts/%s --install --atomic --timeout %dm",
		"argocd app sync %s --prune --revision %s",
	}
)

// condition is one condition type an Agent reports, with its usual reason
// and message, and those of its rare other state.
type condition struct {
	kind string
	// status, reason and message are the condition's usual state.
	status, reason, message string
	// rareStatus, rareReason and rareMessage are its other state; the
	// message is a template of sentence.
	rareStatus, rareReason, rareMessage string
}

var agentConditions = []condition{
	{kind: "Ready", status: "True", reason: "AgentReady", message: "agent is posting ready status",
		rareStatus: "False", rareReason: "AgentNotReady", rareMessage: "agent stopped posting status: last heartbeat %d s ago, container runtime is down"},
	{kind: "MemoryPressure", status: "False", reason: "AgentHasSufficientMemory", message: "agent has sufficient memory available",
		rareStatus: "True", rareReason: "AgentHasInsufficientMemory", rareMessage: "agent has insufficient memory available: %d Mi free, threshold 500 Mi"},
	{kind: "DiskPressure", status: "False", reason: "AgentHasNoDiskPressure", message: "agent has no disk pressure",
		rareStatus: "True", rareReason: "AgentHasDiskPressure", rareMessage: "agent has disk pressure: imagefs %d percent used"},
	{kind: "PIDPressure", status: "False", reason: "AgentHasSufficientPID", message: "agent has sufficient PID available",
		rareStatus: "True", rareReason: "AgentHasInsufficientPID", rareMessage: "agent has insufficient PID available: %d processes running"},
	{kind: "CertificateValid", status: "True", reason: "CertificateRotated", message: "serving certificate rotated by fleet-bootstrap; valid for 90 days",
		rareStatus: "False", rareReason: "CertificateExpiring", rareMessage: "serving certificate expires in %d hours and rotation failed: signer unavailable"},
	{kind: "Schedulable", status: "True", reason: "AgentSchedulable", message: "agent accepts new assignments",
		rareStatus: "False", rareReason: "AgentCordoned", rareMessage: "cordoned for maintenance ticket OPS-%d by the fleet drainer"},
}

// The messages of an Assignment in each phase.
var (
	pendingMessages = []string{
		"waiting for agent %s to accept the assignment",
		"queued behind %d assignments of higher priority",
		"waiting for capacity in pool %s",
	}
	runningMessages = []string{
		"running on %s since step %d",
		"processing batch %d of %d",
		"started by %s; progress reported every %d seconds",
	}
	succeededMessages = []string{
		"completed %d of %d items in %dm%ds",
		"finished: exported %d rows to %s",
	}
	failedMessages = []string{
		"back-off restarting failed step %d: exit code 137 (OOMKilled)",
		"deadline exceeded after %d s: upstream %s returned 503 Service Unavailable",
		"failed to pull image: rpc error: code = NotFound desc = manifest for %s not found",
	}
)
