// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

/// @title StructRegistry (benchmark only; never deployed by the node)
/// @notice The "one struct per run" design of the seed project, rebuilt with the same storage shape
///         so that test/GasBench.t.sol can compare it with Registry's "one anchor per batch root".
/// @dev Per run: five bytes32 inputs (the run id used as the mapping key, plus four content hashes)
///      and the publisher address and a uint64 timestamp packed together: 5 storage slots per run
///      (four hash slots + one publisher|timestamp slot), and an event carrying all fields.
contract StructRegistry {
    struct Run {
        bytes32 yamlHash;
        bytes32 datasetCidHash;
        bytes32 checkpointCidHash;
        bytes32 evalReportHash;
        address publisher;
        uint64 timestamp;
    }

    mapping(bytes32 runId => Run) private _runs;

    event RunStored(
        bytes32 indexed runId,
        address indexed publisher,
        bytes32 yamlHash,
        bytes32 datasetCidHash,
        bytes32 checkpointCidHash,
        bytes32 evalReportHash,
        uint64 timestamp
    );

    error RunAlreadyStored(bytes32 runId);

    function storeRun(
        bytes32 runId,
        bytes32 yamlHash,
        bytes32 datasetCidHash,
        bytes32 checkpointCidHash,
        bytes32 evalReportHash
    ) external {
        Run storage run = _runs[runId];
        if (run.timestamp != 0) revert RunAlreadyStored(runId);
        uint64 ts = uint64(block.timestamp);
        run.yamlHash = yamlHash;
        run.datasetCidHash = datasetCidHash;
        run.checkpointCidHash = checkpointCidHash;
        run.evalReportHash = evalReportHash;
        run.publisher = msg.sender;
        run.timestamp = ts;
        emit RunStored(runId, msg.sender, yamlHash, datasetCidHash, checkpointCidHash, evalReportHash, ts);
    }

    function getRun(bytes32 runId) external view returns (Run memory) {
        return _runs[runId];
    }
}
