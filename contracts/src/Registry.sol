// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

/// @title Registry
/// @notice Write-once anchoring of provenance roots (one Merkle root per batch of run manifests).
/// @dev No owner, no proxy, no pause, no setters, no selfdestruct: once a root is anchored its
///      record can never change or disappear.
///
///      Storage: ONE slot per root. The record `(uint64 timestamp, uint64 blockNumber, address by)`
///      of the external interface is kept packed in a single word:
///
///        bits   0..159  by           (address, 160 bits)
///        bits 160..207  timestamp    (48 bits)
///        bits 208..255  blockNumber  (48 bits)
///
///      20 + 8 + 8 bytes would need two slots (an extra 22,100 gas per anchor for a second cold
///      zero-to-non-zero SSTORE); 48 bits hold any timestamp before the year 8,900,000 and any block
///      number below 2.8e14 (8.9 million years of one-second blocks), so the ABI keeps uint64 while
///      storage uses 48 bits. A chain whose clock or height does not fit reverts with
///      `ClockOverflow()` instead of truncating silently.
///
///      A record is "present" when its word is non-zero. On a real chain every anchor comes from a
///      transaction, so `by` is a non-zero sender and the word is never zero.
contract Registry {
    /// @notice A root was anchored.
    event Anchored(bytes32 indexed root, address indexed by, uint64 timestamp);

    /// @notice `root` already has a record; records are write-once.
    error AlreadyAnchored(bytes32 root);
    /// @notice The zero root is not a valid commitment.
    error ZeroRoot();
    /// @notice block.timestamp or block.number does not fit in 48 bits.
    error ClockOverflow();

    uint256 private constant _TIMESTAMP_SHIFT = 160;
    uint256 private constant _BLOCK_SHIFT = 208;
    uint256 private constant _MASK48 = (1 << 48) - 1;

    mapping(bytes32 root => uint256 packedRecord) private _records;

    /// @notice Anchor `root` once, recording the sender, block timestamp and block number.
    function anchor(bytes32 root) external {
        if (root == bytes32(0)) revert ZeroRoot();
        if (_records[root] != 0) revert AlreadyAnchored(root);

        uint256 ts = block.timestamp;
        uint256 bn = block.number;
        if ((ts | bn) > _MASK48) revert ClockOverflow();

        _records[root] = uint256(uint160(msg.sender)) | (ts << _TIMESTAMP_SHIFT) | (bn << _BLOCK_SHIFT);
        // casting to 'uint64' is safe because ts < 2**48 (checked above)
        // forge-lint: disable-next-line(unsafe-typecast)
        emit Anchored(root, msg.sender, uint64(ts));
    }

    /// @notice The record of `root`; all zero when it was never anchored.
    function anchoredAt(bytes32 root)
        external
        view
        returns (uint64 timestamp, uint64 blockNumber, address by)
    {
        uint256 word = _records[root];
        // Unpacking: each cast keeps exactly the bits its field was stored in (see the layout above).
        // forge-lint: disable-next-line(unsafe-typecast)
        by = address(uint160(word));
        // forge-lint: disable-next-line(unsafe-typecast)
        timestamp = uint64((word >> _TIMESTAMP_SHIFT) & _MASK48);
        // forge-lint: disable-next-line(unsafe-typecast)
        blockNumber = uint64(word >> _BLOCK_SHIFT);
    }

    /// @notice Whether `root` has been anchored.
    function isAnchored(bytes32 root) external view returns (bool) {
        return _records[root] != 0;
    }
}
