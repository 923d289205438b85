//! The manifest's payload: an in-toto Statement v1 whose predicate is SLSA Provenance v1
//! with mindxtrain's build type. Field names follow the specs exactly; what SLSA has no
//! field for is carried in `mindxtrain_*` extension fields, as SLSA v1 recommends
//! (`<vendor>_<name>`; standard names never contain an underscore). Readers ignore
//! unknown fields, as in-toto requires of consumers.

use super::digest::DigestSet;
use crate::energy::Energy;
pub use mindxtrain_trainer::recipe::ReceiptItem;
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub const STATEMENT_TYPE: &str = "https://in-toto.io/Statement/v1";
pub const SLSA_PROVENANCE_V1: &str = "https://slsa.dev/provenance/v1";
/// What a mindxtrain training run is, as an SLSA build type.
pub const BUILD_TYPE: &str = "https://mindxtrain.dev/buildtypes/train/v1";
/// Builder ids are this prefix followed by the node's public key (hex).
pub const BUILDER_ID_PREFIX: &str = "https://mindxtrain.dev/builders/node#";

/// An in-toto ResourceDescriptor (only the fields mindxtrain writes or reads).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ResourceDescriptor {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uri: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<DigestSet>,
    #[serde(default, rename = "mediaType", skip_serializing_if = "Option::is_none")]
    pub media_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<Value>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Subject {
    pub name: String,
    pub digest: DigestSet,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Statement {
    #[serde(rename = "_type")]
    pub type_: String,
    pub subject: Vec<Subject>,
    #[serde(rename = "predicateType")]
    pub predicate_type: String,
    pub predicate: Provenance,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Provenance {
    #[serde(rename = "buildDefinition")]
    pub build_definition: BuildDefinition,
    #[serde(rename = "runDetails")]
    pub run_details: RunDetails,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BuildDefinition {
    #[serde(rename = "buildType")]
    pub build_type: String,
    #[serde(rename = "externalParameters")]
    pub external_parameters: ExternalParameters,
    #[serde(rename = "internalParameters")]
    pub internal_parameters: InternalParameters,
    #[serde(rename = "resolvedDependencies", default)]
    pub resolved_dependencies: Vec<ResourceDescriptor>,
}

/// What the person who asked for the run controlled: the recipe.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExternalParameters {
    pub recipe: Parameter,
    /// The recipe's `meta` as first-class fields (also in `recipe.content`): what the model is
    /// and under which license. Absent from manifests sealed before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub meta: Option<ModelMeta>,
}

/// The recipe's `meta`, as the model card shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ModelMeta {
    pub project: String,
    pub run_name: String,
    pub license: String,
    pub description: String,
}

/// What the node chose: the autotune plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InternalParameters {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<Parameter>,
}

/// A parameter file: its name, digests of its exact bytes, and its content.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Parameter {
    pub name: String,
    pub digest: DigestSet,
    /// Parsed content (the recipe as resolved JSON; the plan's JSON, or its text).
    pub content: Value,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunDetails {
    pub builder: Builder,
    pub metadata: BuildMetadata,
    #[serde(default)]
    pub byproducts: Vec<ResourceDescriptor>,
    /// The accelerator(s) and host the run used, as reported by the trainer (absent when the
    /// recipe's `receipt.include` leaves `hardware` out).
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub mindxtrain_hardware: Value,
    /// Where the run's events are in the node's log (absent without `event_log`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mindxtrain_log: Option<LogPosition>,
    /// The energy the run drew, or why it is not known (absent without `energy_kwh`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mindxtrain_energy: Option<Energy>,
    /// The recipe's `receipt.include`, and what it left out of this statement. Absent from
    /// manifests sealed before it was recorded (they carry every item).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mindxtrain_receipt: Option<ReceiptItems>,
}

/// What the recipe's `receipt.include` asked the manifest to carry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReceiptItems {
    pub include: Vec<ReceiptItem>,
    /// The items the statement does not carry (docs/formats.md, "Manifest": what each is).
    pub omitted: Vec<ReceiptItem>,
}

impl ReceiptItems {
    /// The include list as asked, with everything else omitted.
    pub fn of(include: &[ReceiptItem]) -> ReceiptItems {
        let omitted = ReceiptItem::all().into_iter().filter(|i| !include.contains(i)).collect();
        ReceiptItems { include: include.to_vec(), omitted }
    }

    pub fn has(&self, item: ReceiptItem) -> bool {
        self.include.contains(&item)
    }
}

/// An item's name as recipes write it (`event_log`).
pub fn item_name(item: ReceiptItem) -> String {
    match serde_json::to_value(item) {
        Ok(Value::String(s)) => s,
        _ => format!("{item:?}"),
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Builder {
    pub id: String,
    #[serde(default)]
    pub version: std::collections::BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BuildMetadata {
    #[serde(rename = "invocationId")]
    pub invocation_id: String,
    #[serde(rename = "startedOn")]
    pub started_on: String,
    #[serde(rename = "finishedOn")]
    pub finished_on: String,
}

/// The run's events and the signed log checkpoint taken when the manifest was sealed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LogPosition {
    /// Checkpoint origin (`mindxtrain/<16 hex>`).
    pub origin: String,
    /// First and last seq of the run's events (inclusive).
    #[serde(rename = "firstSeq")]
    pub first_seq: u64,
    #[serde(rename = "lastSeq")]
    pub last_seq: u64,
    /// C2SP signed note over the log at sealing time (its size is > `lastSeq`).
    pub checkpoint: String,
}

impl Statement {
    /// The run id (`runDetails.metadata.invocationId`).
    pub fn run_id(&self) -> &str {
        &self.predicate.run_details.metadata.invocation_id
    }

    /// The items the recipe's `receipt.include` left out (none for manifests sealed before
    /// the list was recorded).
    pub fn omitted(&self) -> &[ReceiptItem] {
        self.predicate.run_details.mindxtrain_receipt.as_ref().map_or(&[], |r| r.omitted.as_slice())
    }

    /// Whether the statement holds `item`'s part (docs/formats.md, "Manifest"): what
    /// `receipt.include` decides. A run may lack a part it was asked for (no evaluation).
    pub fn carries(&self, item: ReceiptItem) -> bool {
        let (b, r) = (&self.predicate.build_definition, &self.predicate.run_details);
        let dep = |name: &str| b.resolved_dependencies.iter().any(|d| d.name.as_deref() == Some(name));
        match item {
            ReceiptItem::RecipeHash => true,
            ReceiptItem::DatasetHashes => dep(DATASET_NAME),
            ReceiptItem::CodeVersion => !r.builder.version.is_empty() || dep(SOURCE_NAME),
            ReceiptItem::Hardware => !r.mindxtrain_hardware.is_null(),
            ReceiptItem::Plan => b.internal_parameters.plan.is_some(),
            ReceiptItem::EvalReport => self.eval().is_some(),
            ReceiptItem::EnergyKwh => r.mindxtrain_energy.is_some(),
            ReceiptItem::EventLog => r.mindxtrain_log.is_some(),
            ReceiptItem::Checkpoints => self.subject.iter().any(|s| s.name.starts_with(CHECKPOINTS_PREFIX)),
        }
    }

    /// The byproduct holding the eval report, if the run had one.
    pub fn eval(&self) -> Option<&ResourceDescriptor> {
        self.predicate.run_details.byproducts.iter().find(|b| b.name.as_deref() == Some(EVAL_NAME))
    }
}

/// Name of the eval report among the byproducts (and in the run's output directory).
pub const EVAL_NAME: &str = "eval.json";
/// Names of the dataset manifest's and the source's resolved dependencies.
pub const DATASET_NAME: &str = "dataset";
pub const SOURCE_NAME: &str = "source";
/// Where the step checkpoints lie among the subjects (`checkpoints/step-NNNNNNNN/…`).
pub const CHECKPOINTS_PREFIX: &str = "checkpoints/";
