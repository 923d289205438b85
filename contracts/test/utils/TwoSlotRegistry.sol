// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

/// @dev Gas-bench alternative to Registry: the literal `(uint64 timestamp, uint64 blockNumber,
///      address by)` struct, which needs two storage slots (8 + 8 + 20 = 36 bytes). Not deployed.
contract TwoSlotRegistry {
    struct Record {
        uint64 timestamp;
        address by; // slot 1: timestamp (8) + by (20) = 28 bytes
        uint64 blockNumber; // slot 2
    }

    mapping(bytes32 => Record) private _records;

    event Anchored(bytes32 indexed root, address indexed by, uint64 timestamp);

    error AlreadyAnchored(bytes32 root);
    error ZeroRoot();

    function anchor(bytes32 root) external {
        if (root == bytes32(0)) revert ZeroRoot();
        Record storage r = _records[root];
        if (r.by != address(0)) revert AlreadyAnchored(root);
        r.timestamp = uint64(block.timestamp);
        r.by = msg.sender;
        r.blockNumber = uint64(block.number);
        emit Anchored(root, msg.sender, uint64(block.timestamp));
    }
}
